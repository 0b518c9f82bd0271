"""Encrypting and decrypting a 100 MB issue: pressrun's pieces against raw libsodium.

Measures, on one core (this process, one thread), with medians of --runs runs, both
the rate per CPU-second of this thread (``time.thread_time``: what one core does,
steady on a machine shared with other work) and the wall-clock rate
(``time.perf_counter``):

- **raw AEAD** (the reference): libsodium's XChaCha20-Poly1305 (PyNaCl's binding of
  ``crypto_aead_xchacha20poly1305_ietf_encrypt`` / ``_decrypt``) over the issue held
  in memory, in the same chunks pressrun uses (piece size - 16 bytes), no file I/O;
- **PieceCipher**: pressrun's framing alone, every piece of the issue encrypted
  (decrypted) with its own nonce and associated data, in memory;
- **pressrun encrypt**: ``encrypt_stream`` from the plaintext file to a ciphertext file
  (read, per-piece nonce and associated data, encrypt, write);
- **pressrun decrypt**: ``decrypt_file`` from the ciphertext file to a new plaintext
  file (read, decrypt and authenticate every piece, SHA-256 of the whole plaintext
  against the manifest, write, fsync) — what ``pressrun get`` runs;
- for information, a whole ``publish --encrypt`` (the above plus SHA-256 of every
  ciphertext piece and of the file, libtorrent's SHA-1 pass, wraps) against a plain
  ``publish`` of the same file.

Targets (issue 11): pressrun's encrypt and decrypt at least 0.8 of the raw AEAD speed
measured in the same run, and at least 500 MB/s on one core (judged on the CPU
rates). Files live in --dir (default: a temp folder under /tmp), warm in the page
cache: this measures the CPU path. Exit status 0 only when every target is met.

    .venv/bin/python bench/crypto.py [--mb 100] [--runs 5] [--piece-size 262144]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import nacl.bindings
import nacl.public

from pressrun.content.bundle import read_manifest
from pressrun.content.codec import num_pieces_for
from pressrun.content.encryption import PieceCipher, decrypt_file, encrypt_stream, open_wrap
from pressrun.content.keys import generate_keypair
from pressrun.content.publish import publish

MB = 1_000_000


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread): both monotonic clocks."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def median_rate(size: int, seconds: list[tuple[float, float]], which: int) -> float:
    """MB/s of the median run, by wall (0) or thread CPU time (1)."""
    return size / statistics.median(s[which] for s in seconds) / MB


class Directory:
    """An in-process subscriber directory for publish (two subscribers, wraps kept)."""

    url = "http://127.0.0.1:8090"

    def __init__(self) -> None:
        self.readers = [nacl.public.PrivateKey.generate() for _ in range(2)]
        self.stored: dict[bytes, bytes] = {}

    def subscriber_keys(self) -> list[bytes]:
        return [bytes(r.public_key) for r in self.readers]

    def store_wraps(
        self, issue_id: str, version: int, wraps: Mapping[bytes, bytes], release: object = None
    ) -> list[bytes]:
        self.stored = dict(wraps)
        return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=100, help="issue size in MB (default 100)")
    ap.add_argument("--runs", type=int, default=5, help="runs per measurement (default 5)")
    ap.add_argument("--piece-size", type=int, default=262144, help="torrent piece size")
    ap.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp one)")
    ap.add_argument("--skip-publish", action="store_true", help="skip the publish measurement")
    args = ap.parse_args()

    size = args.mb * MB
    piece = args.piece_size
    chunk = piece - 16
    work = Path(tempfile.mkdtemp(prefix="pressrun-bench-crypto-", dir=args.dir))
    try:
        plain_path = work / "issue.pdf"
        data = os.urandom(size)
        plain_path.write_bytes(data)
        # one real publish --encrypt gives the manifest; a subscriber's wrap the key
        secret, _ = generate_keypair(work / "publisher.key")
        directory = Directory()
        bundle = publish(
            plain_path,
            issue_id="bench-issue",
            title="bench",
            key_path=secret,
            content_dir=work / "content",
            piece_size=piece,
            encrypt_for=directory,
        )
        manifest = read_manifest(bundle / "manifest.json")
        assert manifest.encryption is not None
        key = open_wrap(
            directory.stored[bytes(directory.readers[0].public_key)],
            directory.readers[0],
            manifest.encryption.key_check,
        )
        cipher = PieceCipher.for_manifest(manifest, key)
        ct_path = bundle / manifest.file_name
        n = num_pieces_for(size, chunk)
        print(
            f"{args.mb} MB issue, pieces of {piece} bytes ({n} pieces), {args.runs} runs, "
            f"one thread; libsodium via PyNaCl {nacl.__version__}",  # type: ignore[attr-defined]
            flush=True,
        )

        # -- the reference: raw AEAD over memory, same chunks, a constant nonce and AD
        view = memoryview(data)
        nonce, ad = bytes(24), bytes(63)
        chunks = [bytes(view[i : i + chunk]) for i in range(0, size, chunk)]

        def raw_encrypt() -> list[bytes]:
            enc = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt
            return [enc(c, ad, nonce, key) for c in chunks]

        sealed = raw_encrypt()

        def raw_decrypt() -> None:
            dec = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_decrypt
            for c in sealed:
                dec(c, ad, nonce, key)

        # -- pressrun's framing alone: every piece through PieceCipher, in memory
        def cipher_encrypt() -> list[bytes]:
            return [cipher.encrypt(i, c) for i, c in enumerate(chunks)]

        pieces = cipher_encrypt()

        def cipher_decrypt() -> None:
            for i, c in enumerate(pieces):
                cipher.decrypt(i, c)

        # -- pressrun: file to file
        ct_out = work / "issue.pdf.enc"

        def pressrun_encrypt() -> None:
            ct_out.unlink(missing_ok=True)
            with open(ct_out, "wb") as out:
                encrypt_stream(cipher, plain_path, lambda i, piece_ct: out.write(piece_ct))

        pressrun_encrypt()
        assert ct_out.read_bytes() == ct_path.read_bytes()  # deterministic: same key, nonces
        out_path = work / "decrypted.pdf"

        def pressrun_decrypt() -> None:
            out_path.unlink(missing_ok=True)
            decrypt_file(manifest, key, ct_path, out_path)

        results: dict[str, list[tuple[float, float]]] = {
            "raw_enc": [],
            "piece_enc": [],
            "enc": [],
            "raw_dec": [],
            "piece_dec": [],
            "dec": [],
        }
        steps = {
            "raw_enc": raw_encrypt,
            "piece_enc": cipher_encrypt,
            "enc": pressrun_encrypt,
            "raw_dec": raw_decrypt,
            "piece_dec": cipher_decrypt,
            "dec": pressrun_decrypt,
        }
        for _ in range(args.runs):
            # interleaved, so a neighbour's load hits all of them alike
            for name, step in steps.items():
                results[name].append(timed(step))
        assert out_path.read_bytes() == data
        rates = {k: (median_rate(size, v, 1), median_rate(size, v, 0)) for k, v in results.items()}
        rows = (
            ("raw AEAD encrypt (memory, same chunks)", "raw_enc", None),
            ("PieceCipher.encrypt, every piece (memory)", "piece_enc", "raw_enc"),
            ("encrypt file to file (+ SHA-256, write)", "enc", "raw_enc"),
            ("raw AEAD decrypt (memory, same chunks)", "raw_dec", None),
            ("PieceCipher.decrypt, every piece (memory)", "piece_dec", "raw_dec"),
            ("decrypt_file (+ SHA-256, write, fsync)", "dec", "raw_dec"),
        )
        print(f"{'':50} {'CPU MB/s':>9} {'wall MB/s':>10}  vs raw (CPU)")
        for label, k, ref in rows:
            cpu, wall = rates[k]
            ratio = "" if ref is None else f"  {cpu / rates[ref][0]:.2f} x raw"
            print(f"{label:50} {cpu:9.0f} {wall:10.0f}{ratio}")
        verdicts = []
        for what, k, ref in (
            ("piece encrypt", "piece_enc", "raw_enc"),
            ("piece decrypt", "piece_dec", "raw_dec"),
            ("file encrypt", "enc", "raw_enc"),
            ("file decrypt", "dec", "raw_dec"),
        ):
            ratio_ok = rates[k][0] >= 0.8 * rates[ref][0]
            speed_ok = rates[k][0] >= 500
            verdicts.append(ratio_ok and speed_ok)
            print(
                f"target {what}: >= 0.8 x raw {'met' if ratio_ok else 'NOT met'}, "
                f">= 500 MB/s on one core {'met' if speed_ok else 'NOT met'}"
            )
        ok = all(verdicts)

        if not args.skip_publish:

            def publish_run(encrypted: bool) -> Callable[[], object]:
                def run() -> object:
                    content = work / "content"
                    shutil.rmtree(content, ignore_errors=True)
                    return publish(
                        plain_path,
                        issue_id="bench-issue",
                        title="bench",
                        key_path=secret,
                        content_dir=content,
                        piece_size=piece,
                        encrypt_for=directory if encrypted else None,
                    )

                return run

            plain_runs: list[tuple[float, float]] = []
            enc_runs: list[tuple[float, float]] = []
            for _ in range(max(1, args.runs // 2)):
                plain_runs.append(timed(publish_run(False)))
                enc_runs.append(timed(publish_run(True)))
            # libtorrent hashes on its own threads: wall time is the fair figure here
            p, e = median_rate(size, plain_runs, 0), median_rate(size, enc_runs, 0)
            print(
                f"publish (copy, SHA-256, torrent SHA-1), wall    {p:6.0f} MB/s; "
                f"publish --encrypt {e:6.0f} MB/s = {e / p:.2f} x plain publish"
            )
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
