"""Built-in prompts for `specdec bench` and `specdec demo`: input-grounded and open-ended."""

from __future__ import annotations

from pathlib import Path

from .config import read_prompts_jsonl
from .errors import ConfigError

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

_SNIPPET = '''def load_users(path):
    users = []
    with open(path) as handle:
        for line in handle:
            name, email, age = line.strip().split(",")
            users.append({"name": name, "email": email, "age": int(age)})
    return users
'''

_PARAGRAPH = (
    "Our team meets every Monday at nine to plan the week. Each person brings a short list of "
    "tasks, and we agree on priorites together before anyone starts coding. On Fridays we review "
    "what was finished and what moved to the next week."
)

_LONG_ARTICLE = " ".join([_ARTICLE,
    "Opponents of the plan argued that the money should go to repairing existing roads first. "
    "The council said both projects would be funded, and that road repairs would begin in the summer. "
    "The new path will be lit at night and will have three rest areas with benches and bicycle pumps. "
    "A public meeting about the design will be held next month at the library, where residents can "
    "comment on the route and suggest names for the rest areas."])

# Short, chat-like answers: what most requests look like (rename, fix, extract, open question).
SHORT_PROMPTS: list[tuple[str, str, str]] = [
    ("rename-variable", "grounded",
     f"```python\n{_SNIPPET}```\nThe same function with the variable `users` renamed to `records`:\n```python\n"),
    ("fix-typo", "grounded",
     f"Text: {_PARAGRAPH}\n\nThe same text with the spelling mistake corrected:\n"),
    ("extract-json", "grounded",
     f"Article: {_ARTICLE}\n\nThe key facts of the article as JSON with keys length_km, cost_eur, start:\n"),
    ("open-question", "open", "Question: What are the three primary colors, and why are they called primary?\nAnswer:"),
    ("define", "open", "Define the word 'photosynthesis' in two sentences.\n\n"),
]

# Long grounded rewrites: the answer restates a long input with small changes.
LONG_PROMPTS: list[tuple[str, str, str]] = [
    ("rewrite-article", "grounded",
     f"Article: {_LONG_ARTICLE}\n\nThe same article, with every 'council' replaced by 'committee':\n"),
    ("annotate-code", "grounded",
     f"```python\n{_CODE}```\nThe same function with a comment above every line:\n```python\n"),
]

_EMAIL = (
    "Hi team, the quarterly review meeting has moved from Thursday to Friday at 10am because the projector in "
    "room B is being repaired. Please bring your updated sales figures and the draft budget for next year. "
    "Lunch will be provided after the meeting. Thanks, Maria"
)

_CSV = "name,age,city\nAlice,34,Paris\nBob,28,Berlin\nCarol,41,Madrid\nDavid,25,Rome\n"

_SQL = '''SELECT customer_id, SUM(amount) AS total
FROM orders
WHERE created_at >= '2024-01-01'
GROUP BY customer_id
HAVING SUM(amount) > 100
ORDER BY total DESC;
'''

_CLAMP = '''def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value
'''

_NOTES = (
    "Our garden has tomatoes, which need full sun and daily watering. The basil grows best next to the "
    "tomatoes. Carrots need loose soil and should be thinned after two weeks. Lettuce prefers shade in the "
    "afternoon and grows quickly."
)

# Held out: written after the adaptive schedule's constants were last tuned and never used to tune them,
# so runs on them show how it does on prompts nobody tuned it on (docs/performance.md, "twenty-third").
# Keep it so: judge a change on them too, tune none to them.
HELDOUT_PROMPTS: list[tuple[str, str, str]] = [
    ("csv-to-json", "grounded", f"CSV:\n{_CSV}\nThe same data as a JSON list of objects:\n"),
    ("sql-rename", "grounded",
     f"```sql\n{_SQL}```\nThe same query with the table `orders` renamed to `purchases`:\n```sql\n"),
    ("add-docstring", "grounded", f"```python\n{_CLAMP}```\nThe same function with a docstring added:\n```python\n"),
    ("bullet-notes", "grounded", f"Notes: {_NOTES}\n\nThe same notes as a bulleted list, one plant per bullet:\n-"),
    ("email-summary", "grounded", f"Email: {_EMAIL}\n\nSummary of the email in one sentence:"),
    ("grounded-qa", "grounded", f"Email: {_EMAIL}\n\nQuestion: When and why was the meeting moved?\nAnswer:"),
    ("poem", "open", "Write a short poem about the sea.\n\n"),
    ("tips", "open", "List five tips for staying productive while working from home.\n\n1."),
]

PROMPT_SETS: dict[str, list[tuple[str, str, str]]] = {
    "default": BENCH_PROMPTS, "short": SHORT_PROMPTS, "long": LONG_PROMPTS, "heldout": HELDOUT_PROMPTS,
    "all": BENCH_PROMPTS + SHORT_PROMPTS + LONG_PROMPTS + HELDOUT_PROMPTS,
}


def chosen_prompts(prompt_set: str, file: Path | None = None) -> list[tuple[str, str]]:
    """(id, text) of the prompts in JSONL ``file`` (read_prompts_jsonl), else of the built-in ``prompt_set``."""
    if file is not None:
        return [(p.id, p.text) for p in read_prompts_jsonl(file, "--prompts")]
    if prompt_set not in PROMPT_SETS:
        raise ConfigError(f"--set {prompt_set!r} must be one of {list(PROMPT_SETS)}")
    return [(pid, text) for pid, _, text in PROMPT_SETS[prompt_set]]
