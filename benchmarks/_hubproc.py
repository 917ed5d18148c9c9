"""Child process: run tests/fakehub.FakeHub, answer JSON-line commands on stdin/stdout.

First line in: the spec (see benchmarks._common.HubProcess); first line out: endpoint and repos.
Then one command per line: bytes_served, requests, reset_log, rss, close.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from benchmarks._common import make_content, proc_status


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol

    def reply(result: Any = None, error: str | None = None) -> None:
        out.write(json.dumps({"error": error} if error else {"result": result}) + "\n")
        out.flush()

    from fakehub import FakeHub

    spec = json.loads(sys.stdin.readline())
    hub = FakeHub().start()
    try:
        repos: dict[str, Any] = {}
        for r in spec["repos"]:
            files: dict[str, bytes] = {}
            info: dict[str, Any] = {}
            for f in r["files"]:
                content = make_content(f)
                files[f["path"]] = content
                info[f["path"]] = {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
            commit = hub.add_repo(r["repo_id"], files)
            files.clear()
            repos[r["repo_id"]] = {"commit": commit, "files": info}
        reply({"endpoint": hub.endpoint, "repos": repos})
        for line in sys.stdin:
            msg = json.loads(line)
            op = msg.pop("op")
            if op == "close":
                reply("bye")
                break
            if op == "bytes_served":
                reply(hub.bytes_served(msg.get("repo_id"), msg.get("path")))
            elif op == "requests":
                counts: dict[str, int] = {}
                for e in list(hub.log):
                    k = f"{e.origin} {e.method}"
                    counts[k] = counts.get(k, 0) + 1
                reply(counts)
            elif op == "reset_log":
                hub.reset_log()
                reply("ok")
            elif op == "rss":
                reply(proc_status())
            else:
                reply(error=f"unknown op {op!r}")
    finally:
        hub.close()


if __name__ == "__main__":
    main()
