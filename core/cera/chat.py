"""Chat templates: the GGUF's `tokenizer.chat_template` rendered with sandboxed jinja2,
as HF transformers and llama.cpp's jinja path do."""
from __future__ import annotations

from jinja2.sandbox import ImmutableSandboxedEnvironment

from cera.errors import InvalidArgument


def _raise_exception(message):
    """The templates' own check of the messages (e.g. roles must alternate)."""
    raise InvalidArgument(f"the chat template refuses these messages: {message}")


def render(template: str, messages: list[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "") -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}])."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=bos_token, eos_token=eos_token)
