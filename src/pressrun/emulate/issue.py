"""The issue an emulation run's clients download, and the commands its client
containers run: `publish_issue` publishes it into the run's content folder (or keeps
its plaintext for a run that publishes it itself), `balancers_for` spreads the clients
over the balancers, `browser_command` is a browser reader container's command.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from pressrun.emulate.project import ISSUE_ID, ORIGINS
from pressrun.emulate.scenario import EmulationScenario

#: where a client container sees the folder its release file appears in
RELEASE_MOUNT = "/run/pressrun-release"


@dataclass(frozen=True, slots=True)
class PublishedIssue:
    """The issue every client downloads, published into the run's content folder."""

    issue_id: str
    content_dir: Path
    key_file: Path
    public_key_hex: str
    sha256: str
    size_bytes: int
    #: the plaintext kept for each run to publish itself (an [embargo] scenario: each
    #: run publishes it encrypted for its own subscription service), else None
    source: Path | None = None


#: the two balancers as the clients reach them (docker-compose.yml)
BALANCERS = ("http://balancer:8080", "http://balancer-2:8080")
#: the web reader's page as the browser readers' containers reach it
READER_URL = "http://reader:8443/"


def balancers_for(number: int, *, single: bool = False) -> str:
    """A client's ``--balancer`` list: both balancers, the first in turn by client
    number, so the crowd is spread over them (their demand shared through Redis) and a
    killed one is passed over by its half of the clients (issue 30); ``single``: the
    first balancer alone (the one-balancer twin)."""
    if single:
        return BALANCERS[0]
    first = number % len(BALANCERS)
    return ",".join(BALANCERS[first:] + BALANCERS[:first])


def browser_command(scenario: EmulationScenario, issue: PublishedIssue, number: int) -> list[str]:
    """A browser reader container's command (`pressrun.emulate.browser_reader`): the
    reader's page, the issue, its SHA-256, the download's deadline (the scenario's
    timeout) and how long the app stays open after it at most."""
    seed_s = scenario.browsers.seed_s if scenario.browsers is not None else 0.0
    return [
        "python3", "-m", "pressrun.emulate.browser_reader", "--release-dir", RELEASE_MOUNT,
        "--name", str(number), "--reader-url", READER_URL, "--issue", issue.issue_id,
        "--sha256", issue.sha256, "--timeout-s", f"{scenario.timeout_s:g}",
        "--seed-s", f"{seed_s:g}",
    ]  # fmt: skip


def publish_issue(
    out_dir: Path, size_mb: float, seed: int, *, pdf: bool = False, publish_now: bool = True
) -> PublishedIssue:
    """A generated issue of ``size_mb`` MB, signed with a fresh key, web seeds on the
    three origins by their service names. ``pdf``: a real PDF padded to the size (the
    reader's sample, `pressrun.reader.sample`), for browser readers: the app draws the
    issue's cover with pdf.js after the download, and on 50 MB of random bytes that
    never ended (flash crowd run E: every phone held all the bytes and no result after
    10 min); else seeded random bytes. ``publish_now=False``: the key and the file
    only (kept as ``source``), for runs that publish it themselves (`run_variant`)."""
    from pressrun.content.keys import generate_keypair, load_public_key
    from pressrun.content.publish import publish

    content = out_dir / "content"
    content.mkdir(parents=True, exist_ok=True)
    key, pub = generate_keypair(out_dir / "publisher.key", force=True)
    size = int(size_mb * 1e6)
    source = out_dir / "source" / f"{ISSUE_ID}.pdf"
    source.parent.mkdir(exist_ok=True)
    if pdf:
        from pressrun.reader.sample import write_sample_pdf

        write_sample_pdf(source, title="Flash crowd issue", pad_to_bytes=size, seed=seed)
        data = source.read_bytes()
        size = len(data)
    else:
        data = random.Random(seed).randbytes(size)
        source.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    del data
    if not publish_now:
        return PublishedIssue(
            ISSUE_ID, content, key, load_public_key(pub).hex(), sha, size, source=source
        )
    publish(
        source,
        issue_id=ISSUE_ID,
        title="Flash crowd issue (generated sample)",
        key_path=key,
        content_dir=content,
        web_seeds=[f"http://{name}:{port}" for name, port in ORIGINS.items()],
    )
    source.unlink()
    return PublishedIssue(ISSUE_ID, content, key, load_public_key(pub).hex(), sha, size)
