"""The models of the omni_speech pipeline: small, random-weight torch modules that run on CPU.

Everything here is plain torch, with no downloads: a byte-level tokenizer, a
synthetic audio source and its log-mel features (``torch.stft`` and a mel
filterbank built here), a text encoder, an audio encoder, a decoder-only
"thinker" with a KV cache, a "talker" that turns each token into codec frames,
and a harmonic vocoder that turns codec frames into PCM.

The weights are random, drawn from a fixed seed (:func:`seeded`), so every
process that builds a model gets the same weights and the same input always
gives the same audio. The thinker's "answer" is therefore meaningless text;
the point is the shape of the compute: prefill, a token per step, frames per
token, samples per frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import attrs
import torch
from torch import nn
from torch.nn import functional as F

# --------------------------------------------------------------------------------------- sizes

SAMPLE_RATE = 16_000
#: log-mel front end: 25 ms windows, 10 ms hop, 40 mel bands.
N_FFT = 400
HOP = 160
N_MELS = 40

#: byte-level vocabulary: 256 bytes, then the specials.
BOS = 256
EOS = 257
VOCAB = 260
#: the thinker only speaks printable ASCII, so its (random) answer prints.
PRINTABLE = (32, 127)
MAX_TEXT_TOKENS = 256
MAX_POSITIONS = 1024

D_MODEL = 128
N_HEADS = 4
N_LAYERS = 2

#: the codec: every frame is one code per codebook.
CODEBOOKS = 2
CODEBOOK_SIZE = 64
#: the talker speaks this many codec frames per thinker token ...
FRAMES_PER_TOKEN = 4
#: ... and the vocoder turns each frame into this many samples (20 ms).
SAMPLES_PER_FRAME = 320
N_HARMONICS = 16

M = TypeVar("M", bound=nn.Module)


def seeded(seed: int, build: Callable[[], M]) -> M:
    """``build()`` with the global torch RNG seeded to ``seed`` (restored afterwards); eval mode, no grads.

    The same seed gives the same weights in every process, which is what makes
    the output identical whichever placement runs the model.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    model.eval()
    model.requires_grad_(False)
    return model


# ------------------------------------------------------------------------------ text and audio


def encode_text(text: str) -> torch.Tensor:
    """Byte-level token ids: ``BOS`` and the UTF-8 bytes (at most :data:`MAX_TEXT_TOKENS` in all)."""
    ids = [BOS, *text.encode("utf-8")][:MAX_TEXT_TOKENS]
    return torch.tensor(ids, dtype=torch.int64)


def decode_tokens(ids: list[int]) -> str:
    """The text of byte tokens (specials dropped)."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def synthesize_audio(seconds: float = 1.0, freq_hz: float = 440.0, noise: float = 0.05, seed: int = 0) -> torch.Tensor:
    """A test signal: a tone with a little seeded noise, float32 samples at :data:`SAMPLE_RATE`."""
    if not 0 < seconds <= 10:
        raise ValueError(f"audio seconds must be in (0, 10], got {seconds}")
    n = int(seconds * SAMPLE_RATE)
    t = torch.arange(n, dtype=torch.float64) / SAMPLE_RATE
    wave = 0.5 * torch.sin(2 * math.pi * freq_hz * t)
    generator = torch.Generator().manual_seed(seed)
    wave = wave + noise * torch.randn(n, generator=generator, dtype=torch.float64)
    return wave.to(torch.float32)


def mel_filterbank(n_fft: int = N_FFT, n_mels: int = N_MELS, sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Triangular filters on the HTK mel scale, ``[n_mels, n_fft // 2 + 1]``."""

    def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + hz / 700.0)

    def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)

    freqs = torch.linspace(0.0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    top = hz_to_mel(torch.tensor(sample_rate / 2, dtype=torch.float64))
    edges = mel_to_hz(torch.linspace(0.0, float(top), n_mels + 2, dtype=torch.float64))
    lower, center, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs - lower) / (center - lower)
    falling = (upper - freqs) / (upper - center)
    return torch.clamp(torch.minimum(rising, falling), min=0.0).to(torch.float32)


_MEL_FILTERS = mel_filterbank()
_WINDOW = torch.hann_window(N_FFT)


def log_mel(wave: torch.Tensor) -> torch.Tensor:
    """Log-mel features of float32 samples: ``[frames, N_MELS]``, one frame per 10 ms."""
    spectrum = torch.stft(wave, N_FFT, hop_length=HOP, window=_WINDOW, center=True, return_complex=True)
    power = spectrum.abs() ** 2  # [freqs, frames]
    return torch.log(torch.clamp(_MEL_FILTERS @ power, min=1e-6)).T.contiguous()


# ----------------------------------------------------------------------------- transformer parts

KV = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    """Multi-head self-attention over one sequence ``[T, D]``, with an optional KV cache."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, *, causal: bool, cache: KV | None = None) -> tuple[torch.Tensor, KV]:
        steps, d_model = x.shape
        q, k, v = (t.view(steps, self.n_heads, -1).transpose(0, 1) for t in self.qkv(x).chunk(3, dim=-1))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
        # Prefill (no cache) is causal; a decode step (one query) sees the whole cache.
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal and cache is None)
        return self.out(attended.transpose(0, 1).reshape(steps, d_model)), (k, v)


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, *, causal: bool, cache: KV | None = None) -> tuple[torch.Tensor, KV]:
        attended, kv = self.attn(self.norm1(x), causal=causal, cache=cache)
        x = x + attended
        return x + self.mlp(self.norm2(x)), kv


# ------------------------------------------------------------------------------------- encoders


class TextEncoder(nn.Module):
    """Token ids ``[T]`` -> one vector per token ``[T, D_MODEL]`` (bidirectional)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Embedding(MAX_TEXT_TOKENS, D_MODEL)
        self.block = Block(D_MODEL, N_HEADS)
        self.norm = nn.LayerNorm(D_MODEL)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position(torch.arange(ids.shape[0]))
        x, _ = self.block(x, causal=False)
        return self.norm(x)


class AudioEncoder(nn.Module):
    """A batch of log-mel features ``[B, L, N_MELS]`` -> ``[B, L/4, D_MODEL]`` (two stride-2 convs).

    Padded frames are zeroed after every layer, so a request's output does not
    depend on the other requests of its batch.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(N_MELS, D_MODEL, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(D_MODEL, D_MODEL, kernel_size=3, stride=2, padding=1)
        self.proj = nn.Linear(D_MODEL, D_MODEL)

    @staticmethod
    def output_length(frames: int) -> int:
        """Encoder frames for ``frames`` mel frames."""
        for _ in range(2):
            frames = (frames - 1) // 2 + 1
        return frames

    def forward(self, mels: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        x = mels.transpose(1, 2)  # [B, N_MELS, L]
        for conv in (self.conv1, self.conv2):
            x = F.gelu(conv(x))
            lengths = [(n - 1) // 2 + 1 for n in lengths]
            mask = torch.arange(x.shape[-1])[None, :] < torch.tensor(lengths)[:, None]
            x = x * mask[:, None, :]
        return self.proj(x.transpose(1, 2))


# -------------------------------------------------------------------------------------- thinker


@attrs.define
class Generation:
    """One request's decoding state in the thinker."""

    cache: list[KV]
    logits: torch.Tensor
    position: int
    tokens: list[int] = attrs.Factory(list)


class Thinker(nn.Module):
    """A small decoder-only LM over byte tokens, prefixed by the encoders' outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Embedding(MAX_POSITIONS, D_MODEL)
        self.modality = nn.Embedding(2, D_MODEL)  # 0: audio, 1: text
        self.blocks = nn.ModuleList(Block(D_MODEL, N_HEADS) for _ in range(N_LAYERS))
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def _run(self, x: torch.Tensor, position: int, caches: list[KV] | None) -> tuple[torch.Tensor, list[KV]]:
        x = x + self.position(torch.arange(position, position + x.shape[0]))
        new_caches = []
        for index, block in enumerate(self.blocks):
            x, kv = block(x, causal=True, cache=None if caches is None else caches[index])
            new_caches.append(kv)
        return self.head(self.norm(x[-1])), new_caches

    def prefill(self, text: torch.Tensor, audio: torch.Tensor | None, max_new_tokens: int) -> Generation:
        """Run the prefix (audio, text, then BOS) through the model; the first token's logits are ready."""
        parts = [] if audio is None else [audio + self.modality.weight[0]]
        parts += [text + self.modality.weight[1], self.embed.weight[BOS : BOS + 1]]
        prefix = torch.cat(parts)
        if prefix.shape[0] + max_new_tokens > MAX_POSITIONS:
            raise ValueError(f"prefix of {prefix.shape[0]} + {max_new_tokens} new tokens exceeds {MAX_POSITIONS}")
        logits, cache = self._run(prefix, 0, None)
        return Generation(cache=cache, logits=logits, position=prefix.shape[0])

    def step(self, state: Generation) -> int:
        """Greedy: take the next token, then compute the logits after it (one decode step)."""
        low, high = PRINTABLE
        token = low + int(torch.argmax(state.logits[low:high]))
        state.tokens.append(token)
        state.logits, state.cache = self._run(self.embed.weight[token : token + 1], state.position, state.cache)
        state.position += 1
        return token


# --------------------------------------------------------------------------------------- talker

_CODE_OFFSETS = torch.arange(CODEBOOKS) * CODEBOOK_SIZE


@attrs.define
class TalkerState:
    """One request's talker state: the recurrent state and the last frame's codes."""

    hidden: torch.Tensor = attrs.Factory(lambda: torch.zeros(1, Talker.HIDDEN))
    codes: torch.Tensor = attrs.Factory(lambda: torch.zeros(CODEBOOKS, dtype=torch.int64))
    frames: int = 0
    tokens: int = 0


class Talker(nn.Module):
    """Token -> :data:`FRAMES_PER_TOKEN` codec frames, autoregressively (a GRU cell over frames)."""

    HIDDEN = 128

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, 64)
        self.code = nn.Embedding(CODEBOOKS * CODEBOOK_SIZE, 64)
        self.frame_in_token = nn.Embedding(FRAMES_PER_TOKEN, 64)
        self.cell = nn.GRUCell(64, self.HIDDEN)
        self.head = nn.Linear(self.HIDDEN, CODEBOOKS * CODEBOOK_SIZE)

    def frame(self, token: int, index: int, state: TalkerState) -> torch.Tensor:
        """The ``index``-th frame of ``token``: one int64 code per codebook."""
        x = self.token.weight[token] + self.code(state.codes + _CODE_OFFSETS).sum(0) + self.frame_in_token.weight[index]
        state.hidden = self.cell(x[None], state.hidden)
        state.codes = self.head(state.hidden[0]).view(CODEBOOKS, CODEBOOK_SIZE).argmax(-1)
        state.frames += 1
        return state.codes.clone()


# -------------------------------------------------------------------------------------- vocoder


@attrs.frozen
class Voice:
    """How the vocoder colours its output: ``pitch`` scales the predicted pitch, ``tilt`` bends the
    harmonics' mix towards the low (> 0: darker) or high (< 0: brighter) ones."""

    pitch: float
    tilt: float


#: The demo's voices; ``alloy`` is the model's own (neither pitch nor mix changed).
VOICES = {
    "alloy": Voice(1.0, 0.0),
    "echo": Voice(0.8, 0.5),
    "onyx": Voice(0.6, 1.0),
    "nova": Voice(1.3, -0.3),
    "shimmer": Voice(1.6, -0.6),
}
DEFAULT_VOICE = "alloy"
#: ``speed`` scales the duration of every frame by 1/speed (the pitch stays), within these bounds.
MIN_SPEED, MAX_SPEED = 0.25, 4.0


def check_voice(voice: object, speed: object) -> tuple[str, float]:
    """``(voice, speed)`` if both are valid, else ValueError saying what is allowed."""
    if voice not in VOICES:
        raise ValueError(f"unknown voice {voice!r}; the demo speaks with {', '.join(VOICES)}")
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be a number in [{MIN_SPEED}, {MAX_SPEED}], got {speed!r}")
    return str(voice), float(speed)


def samples_per_frame(speed: float) -> int:
    """PCM samples per codec frame at ``speed`` (:data:`SAMPLES_PER_FRAME` at 1)."""
    return max(1, round(SAMPLES_PER_FRAME / speed))


@attrs.define
class VocoderState:
    """One request's synthesis state: where the oscillators are, so frames join without clicks;
    its voice, and how many samples each frame becomes (from its speed)."""

    phase: float = 0.0
    f0: float | None = None
    amps: torch.Tensor = attrs.Factory(lambda: torch.zeros(N_HARMONICS, 1, dtype=torch.float64))
    frames: int = 0
    samples: int = 0
    voice: Voice = VOICES[DEFAULT_VOICE]
    frame_samples: int = SAMPLES_PER_FRAME


class Vocoder(nn.Module):
    """Codec frame -> :data:`SAMPLES_PER_FRAME` PCM samples with a harmonic (additive) synthesizer.

    The network predicts a pitch, a loudness and the harmonics' mix from the
    frame's codes; pitch and amplitudes glide linearly from the previous frame.
    """

    def __init__(self) -> None:
        super().__init__()
        self.code = nn.Embedding(CODEBOOKS * CODEBOOK_SIZE, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 2 + N_HARMONICS))

    def frame(self, codes: torch.Tensor, state: VocoderState) -> torch.Tensor:
        """Float32 PCM ``[state.frame_samples]`` in [-1, 1] for one frame's codes, in the state's voice."""
        params = self.mlp(self.code(codes.reshape(-1) + _CODE_OFFSETS).sum(0)).to(torch.float64)
        f0 = (90.0 + 250.0 * float(torch.sigmoid(params[0]))) * state.voice.pitch
        mix = torch.softmax(params[2:], dim=0)
        if state.voice.tilt:
            mix = torch.softmax(params[2:] - state.voice.tilt * torch.log(torch.arange(1.0, N_HARMONICS + 1)), dim=0)
        amps = (mix * 0.6 * torch.sigmoid(params[1]))[:, None]
        n = state.frame_samples
        ramp = torch.arange(1, n + 1, dtype=torch.float64) / n
        start_f0 = f0 if state.f0 is None else state.f0
        pitch = start_f0 + (f0 - start_f0) * ramp
        phase = state.phase + torch.cumsum(2 * math.pi * pitch / SAMPLE_RATE, dim=0)
        harmonics = torch.arange(1, N_HARMONICS + 1, dtype=torch.float64)[:, None]
        audible = (harmonics * pitch < SAMPLE_RATE / 2).to(torch.float64)
        gains = (state.amps + (amps - state.amps) * ramp) * audible
        pcm = (gains * torch.sin(harmonics * phase)).sum(0)
        state.phase = float(phase[-1]) % (2 * math.pi)
        state.f0, state.amps = f0, amps
        state.frames += 1
        state.samples += n
        return pcm.clamp(-1.0, 1.0).to(torch.float32)
