"""Model families, to keep a judge from grading its own family's outputs (self-preference bias).

A judge tends to prefer text written by a model like itself. The guard compares
the judge model's family with the policy's (``args.policy_model``, else the
``model`` a ``ChatResponse`` reports) and, by ``args.self_preference``, stops
the run (``error``), warns and reports ``self_preference_risk = 1`` (``warn``)
or does nothing (``off``). Unknown families never match.
"""

from __future__ import annotations

import re

__all__ = ["FAMILIES", "model_family", "same_family"]

# family -> patterns matched against the lower-cased last path segment of a model name
FAMILIES: dict[str, tuple[str, ...]] = {
    "openai": (r"^gpt", r"^chatgpt", r"^o[1-9](?:$|[-_.])", r"^text-davinci", r"^davinci", r"^babbage"),
    "anthropic": (r"claude",),
    "google": (r"gemini", r"gemma", r"palm", r"bison"),
    "meta": (r"llama", r"^codellama"),
    "qwen": (r"qwen", r"^qwq", r"^qvq"),
    "mistral": (r"mistral", r"mixtral", r"codestral", r"ministral", r"pixtral", r"magistral", r"devstral"),
    "deepseek": (r"deepseek",),
    "microsoft": (r"^phi[-_.0-9]",),
    "huggingface": (r"smollm",),
    "cohere": (r"^command", r"^c4ai", r"^aya"),
    "xai": (r"^grok",),
    "zhipu": (r"^glm", r"chatglm"),
    "01-ai": (r"^yi[-_.0-9]",),
    "internlm": (r"internlm",),
    "baichuan": (r"baichuan",),
    "tii": (r"falcon",),
    "moonshot": (r"moonshot", r"kimi"),
    "minimax": (r"minimax", r"abab"),
    "ibm": (r"granite",),
    "nvidia": (r"nemotron",),
    "allenai": (r"olmo", r"tulu"),
}

# organisations that appear as a path segment ("meta-llama/Llama-3-8B", "Qwen/Qwen2.5-7B")
_ORGS = {
    "openai": "openai",
    "anthropic": "anthropic",
    "google": "google",
    "meta-llama": "meta",
    "facebook": "meta",
    "qwen": "qwen",
    "mistralai": "mistral",
    "deepseek-ai": "deepseek",
    "microsoft": "microsoft",
    "huggingfacetb": "huggingface",
    "cohereforai": "cohere",
    "coherelabs": "cohere",
    "thudm": "zhipu",
    "zai-org": "zhipu",
    "01-ai": "01-ai",
    "internlm": "internlm",
    "tiiuae": "tii",
    "moonshotai": "moonshot",
    "ibm-granite": "ibm",
    "nvidia": "nvidia",
    "allenai": "allenai",
}


def model_family(name: str | None) -> str | None:
    """The family of a model name (``"gpt-4o-mini"`` -> ``"openai"``), or None when unknown.

    Provider prefixes (``openrouter/``, ``hosted_vllm/``) are skipped; a
    fine-tune keeps its base family (``ft:gpt-4o-mini:org::id`` -> ``openai``).
    """
    if not name or not isinstance(name, str):
        return None
    lowered = name.strip().lower()
    if lowered.startswith("ft:"):
        lowered = lowered[3:].split(":", 1)[0]
    segments = [s for s in re.split(r"[/\\]", lowered) if s]
    for segment in reversed(segments):
        for family, patterns in FAMILIES.items():
            if any(re.search(p, segment) for p in patterns):
                return family
    for segment in segments[:-1]:
        if segment in _ORGS:
            return _ORGS[segment]
    return None


def same_family(judge: str | None, policy: str | None) -> str | None:
    """The shared family of two model names, or None when they differ or one is unknown."""
    a, b = model_family(judge), model_family(policy)
    return a if a is not None and a == b else None
