"""The ``models:`` entries of the deployment file, parsed once at load into
:class:`ModelConfig` (issue 23: configuration parsed once). Every key is checked here,
used or not, with errors naming the file and the key path; what depends on a pipeline
(its lease must outlast one call's worst case) is checked where a drafter is built
(:func:`bot.drafters.llm.checked`). No I/O: the API key is read at first use."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import DrafterSetupError
from ..redact import redact_url, register
from .checker import Checker, parse_duration
from .prices import Price, parse_price

PROVIDERS = ("template", "openai", "anthropic")
#: Where each provider's API is when ``base_url`` is not set.
DEFAULT_BASE_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
#: The environment variable each provider's key is read from when ``api_key_env`` is not
#: set and the model has no ``base_url`` of its own.
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
#: Longest pause between two attempts of one call.
MAX_BACKOFF = 30.0
#: Used as the API key for local servers (Ollama, llama.cpp...) that want none.
NO_KEY = "not-needed"
_KNOWN = {"provider", "base_url", "model", "api_key_env", "temperature", "max_output_tokens",
          "timeout", "retries", "backoff", "price"}


@dataclass(frozen=True)
class ModelConfig:
    """One ``models:`` entry. The template drafter uses only ``name`` and ``provider``."""

    name: str  # the models: entry, e.g. "default"
    provider: str
    base_url: str | None = None  # the provider's own endpoint when not set
    model: str = ""
    api_key_env: str | None = None
    temperature: float | None = None
    max_output_tokens: int = 1024
    timeout: float = 60.0
    retries: int = 2
    backoff: float = 1.0
    price: Price | None = None  # {input, output} per million tokens (draftgate eval)

    @property
    def where(self) -> str:
        return f"models.{self.name}"

    @property
    def shown_url(self) -> str:
        """``base_url`` as an operator may read it: credentials in it are hidden."""
        return redact_url(self.base_url or "", keep_user=False)

    def redact(self, text: str) -> str:
        """``text`` without the credentials of ``base_url`` or the API key, should an
        SDK, a proxy or a provider have echoed them."""
        url = self.base_url or ""
        if url and url != self.shown_url:
            text = text.replace(url, self.shown_url)
        secrets = []
        with contextlib.suppress(ValueError):
            parts = urlsplit(url)
            secrets += [parts.password or "", parts.username or ""]
        if self.api_key_env:
            secrets.append(os.environ.get(self.api_key_env, ""))
        for secret in sorted(filter(None, secrets), key=len, reverse=True):
            for form in {secret, unquote(secret)}:
                if len(form) >= 3:
                    text = text.replace(form, "***")
        return text

    def worst_case(self) -> float:
        """Least time every attempt needs when each one times out (plus the backoff
        between them); 90% of a pipeline's lease has to be longer."""
        waits = sum(min(self.backoff * 2 ** i, MAX_BACKOFF) for i in range(self.retries))
        return self.timeout * (self.retries + 1) + waits

    def api_key(self) -> str:
        """The secret, read at first use. The error names the variable, never a value."""
        if not self.api_key_env:
            return NO_KEY
        value = os.environ.get(self.api_key_env, "")
        register(value, self.api_key_env)  # hidden wherever it might be echoed
        if not value:
            raise DrafterSetupError(
                f"{self.where}: environment variable {self.api_key_env} is not set; export it "
                f"with the {self.provider} API key (or remove api_key_env for a local server "
                f"that needs no key)")
        return value


def parse_model(ck: Checker, name: str, raw: Any) -> ModelConfig | None:
    """``models.<name>`` checked and typed; None (with errors in ``ck``) when it cannot be."""
    where = f"models.{name}"
    data = ck.mapping(raw, where)
    provider = ck.get(data, "provider", where, str, choices=PROVIDERS)
    if "api_key" in data:
        ck.error(f"{where}.api_key", "never put the key in YAML; set api_key_env to the name "
                                     "of an environment variable that holds it")
    if provider is None:
        return None
    price = parse_price(ck, data, where)
    if provider == "template":
        ck.unknown({k: v for k, v in data.items() if k != "api_key"}, {"provider", "price"}, where)
        return ModelConfig(name, provider, price=price)
    ck.unknown({k: v for k, v in data.items() if k != "api_key"}, _KNOWN, where)
    base_url = ck.get(data, "base_url", where, str, default=None)
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        ck.error(f"{where}.base_url", f"expected an http:// or https:// URL, got "
                                     f"{redact_url(base_url, keep_user=False)!r}")
    model = ck.get(data, "model", where, str)
    if model is not None and not model.strip():
        ck.error(f"{where}.model", "expected a model name, e.g. gpt-4.1-mini or llama3.1")
    # The official endpoint needs a key, so it defaults to the usual variable; a
    # custom base_url (Ollama, vLLM...) often needs none.
    key_env = ck.get(data, "api_key_env", where, str,
                     default=None if base_url else DEFAULT_KEY_ENV[provider])
    temperature = ck.get(data, "temperature", where, float, default=None)
    if temperature is not None and provider == "anthropic":
        ck.error(f"{where}.temperature", f"the {provider} provider takes no temperature "
                                         f"(its Messages API has none); remove it")
    elif temperature is not None and not 0 <= temperature <= 2:
        ck.error(f"{where}.temperature", f"expected a number from 0 to 2, got {temperature}")
    max_out = ck.get(data, "max_output_tokens", where, int, default=1024)
    if max_out is not None and max_out < 1:
        ck.error(f"{where}.max_output_tokens", "expected a whole number of at least 1")
    timeout = ck.convert(data, "timeout", where, parse_duration, default=60.0)
    if timeout is not None and timeout <= 0:
        ck.error(f"{where}.timeout", "expected a duration above zero, like 60s")
    retries = ck.get(data, "retries", where, int, default=2)
    if retries is not None and not 0 <= retries <= 10:
        ck.error(f"{where}.retries", f"expected a whole number from 0 to 10, got {retries}")
    backoff = ck.convert(data, "backoff", where, parse_duration, default=1.0)
    if backoff is not None and backoff < 0:
        ck.error(f"{where}.backoff", "expected a duration of zero or more, like 1s")
    if None in (model, max_out, timeout, retries, backoff):
        return None
    return ModelConfig(name, provider, base_url or DEFAULT_BASE_URL[provider], str(model),
                       key_env, temperature, int(max_out), float(timeout), int(retries),
                       float(backoff), price)
