"""A test adapter for the small pipelines of tests/stages.py: text in, the stages' trail out."""

from __future__ import annotations

from typing import Any

from omni_trio.serve import ChatRequest, Completion, PipelineInput, ServeAdapter


class TrailAdapter(ServeAdapter):
    """The user's text is the input; the text ``block`` makes the slow stage wait until it is aborted."""

    def chat_input(self, request: ChatRequest) -> PipelineInput:
        text = super().chat_input(request).inputs
        return PipelineInput(text, {"block": text == "block"})

    def completion(self, result: Any) -> Completion:
        return Completion(" ".join(result["trail"]))


class HolderAdapter(TrailAdapter):
    """For ``create_replica_holder``: the replica reports into ``folder``; ``block`` holds the request."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def chat_input(self, request: ChatRequest) -> PipelineInput:
        given = super().chat_input(request)
        return PipelineInput(given.inputs, {**given.params, "dir": self.folder})
