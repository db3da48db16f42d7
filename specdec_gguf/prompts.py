"""Built-in prompts for `specdec bench` and `specdec demo`: input-grounded and open-ended."""

from __future__ import annotations

_CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
'''

_CONFIG = '''[server]
host = "127.0.0.1"
port = 8080
workers = 4
timeout_seconds = 30

[database]
url = "postgres://localhost/app"
pool_size = 10
echo = false
'''

_ARTICLE = (
    "The city council voted on Tuesday to extend the riverside cycle path by four kilometres. "
    "The extension will connect the old harbour district with the university campus, and construction "
    "is expected to start in the spring. Council members said the project would cost 3.2 million euros, "
    "most of it paid by a regional transport grant. Local shop owners welcomed the plan, saying more "
    "cyclists would bring more customers to the harbour district."
)

# (id, kind, text): "grounded" prompts copy much of their input, "open" ones do not.
BENCH_PROMPTS: list[tuple[str, str, str]] = [
    ("code-edit", "grounded",
     f"Here is a Python function:\n```python\n{_CODE}```\n"
     f"The same function with type hints added, otherwise unchanged:\n```python\n"),
    ("config-edit", "grounded",
     f"Configuration file:\n```toml\n{_CONFIG}```\nThe same file with port changed to 9090:\n```toml\n"),
    ("quote-article", "grounded",
     f"Article: {_ARTICLE}\n\nQuote the article's second and third sentences exactly:\n"),
    ("story", "open", "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"),
    ("explain", "open", "Explain in simple words why the sky is blue.\n\n"),
]

DEMO_PROMPT = BENCH_PROMPTS[0][2]
