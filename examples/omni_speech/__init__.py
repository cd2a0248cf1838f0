"""omni_speech: a streaming speech pipeline with real (small, random-weight) torch models on CPU.

``preprocess`` fans out to a text and an audio encoder, the ``thinker`` fans
them in and decodes tokens one by one, streaming each to the ``talker``, which
streams codec frames to the ``vocoder``, which streams PCM to the caller.

* :mod:`examples.omni_speech.models`: the torch models and the audio front end;
* :mod:`examples.omni_speech.stages`: the stage factories, schedulers and hooks;
* :mod:`examples.omni_speech.pipeline`: ``make_config(placement)`` and client helpers;
* ``python -m examples.omni_speech``: the client (see ``--help`` and docs/omni-speech.md).

Real models (no downloads: both ship in their wheels):

* :mod:`examples.omni_speech.asr`: pocketsphinx speech recognition, a request stage and a streaming session stage;
* :mod:`examples.omni_speech.espeak`, :mod:`examples.omni_speech.tts`: the espeak-ng voice, streamed as it speaks;
* :mod:`examples.omni_speech.voice`: audio in -> ASR -> responder -> TTS (``python -m examples.omni_speech.voice``).
"""
