"""A small ctypes binding of the espeak-ng synthesizer that the ``espeakng-loader`` wheel ships.

The wheel bundles ``libespeak-ng`` and its voice data, so nothing is
downloaded or installed system-wide. (The ``espeakng`` package on PyPI runs
an ``espeak-ng`` executable in a subprocess and cannot hand back audio as it
is made, hence this binding.) espeak-ng is one synthesizer per process with
global state, so :func:`synthesize` holds a process-wide lock: requests in
one process take turns, each one's chunks streamed as espeak makes them.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import espeakng_loader
import numpy as np

#: ``espeak_Initialize``'s output mode: synthesize in the calling thread, hand audio to the callback.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
#: The callback gets audio in pieces of this many milliseconds.
CHUNK_MS = 100
#: ``espeak_SetParameter`` ids.
_RATE, _WORDGAP = 1, 7
#: ``espeak_Synth``: positions count characters; the text is UTF-8.
_POS_CHARACTER, _CHARS_UTF8 = 1, 1

# int callback(short *wav, int numsamples, espeak_EVENT *events): 0 goes on, 1 stops the synthesis.
_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

#: ``on_chunk(samples)``, samples int16 at :func:`sample_rate`; returning False stops the synthesis.
ChunkSink = Callable[[np.ndarray], bool]


class _Engine:
    """The loaded library, initialized once; one synthesis at a time."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, CHUNK_MS, espeakng_loader.get_data_path().encode(), 0)
        if rate <= 0:
            raise RuntimeError(f"espeak-ng did not initialize (espeak_Initialize returned {rate})")
        self.lib = lib
        self.sample_rate = int(rate)
        self.lock = threading.Lock()
        self.sink: ChunkSink | None = None
        # Kept referenced: the library calls it for as long as the process lives.
        self.callback = _SynthCallback(self._on_audio)
        lib.espeak_SetSynthCallback(self.callback)

    def _on_audio(self, wav: ctypes._Pointer[ctypes.c_short], count: int, events: int) -> int:
        if count <= 0 or self.sink is None:
            return 0
        samples = np.ctypeslib.as_array(wav, (count,)).copy()  # espeak reuses its buffer
        return 0 if self.sink(samples) else 1


_engine: _Engine | None = None
_engine_lock = threading.Lock()


def engine() -> _Engine:
    """The process's espeak-ng, loaded on first use."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = _Engine()
        return _engine


def sample_rate() -> int:
    """The rate of the audio espeak-ng makes (22050 Hz for its voices)."""
    return engine().sample_rate


def synthesize(text: str, on_chunk: ChunkSink, *, voice: str = "en-us", words_per_minute: int = 150,
               word_gap_ms: int = 0) -> bool:
    """Speak ``text``, handing each piece of int16 audio (:data:`CHUNK_MS` long) to ``on_chunk`` as it is made.

    Returns once the text is spoken: True, or False if ``on_chunk`` stopped it.
    """
    espeak = engine()
    with espeak.lock:
        lib = espeak.lib
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        lib.espeak_SetParameter(_RATE, int(words_per_minute), 0)
        lib.espeak_SetParameter(_WORDGAP, max(int(word_gap_ms) // 10, 0), 0)  # in 10 ms units
        stopped = False

        def sink(samples: np.ndarray) -> bool:
            nonlocal stopped
            stopped = not on_chunk(samples)
            return not stopped

        espeak.sink = sink
        try:
            data = text.encode()
            error = lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        finally:
            espeak.sink = None
        if error != 0 and not stopped:
            raise RuntimeError(f"espeak-ng failed to speak (espeak_Synth returned {error})")
        return not stopped
