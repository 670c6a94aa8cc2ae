#!/usr/bin/env python3
"""Bridges opjournal's escalation webhooks to a chat channel's incoming webhook.

Receives the events the reconcile worker POSTs (docs/webhooks.md), verifies each one's
Standard Webhooks signature over the raw body, drops repeats by event id (delivery is at least
once), and posts one line per event to CHAT_WEBHOOK_URL as {"text": "..."}: the form Slack,
Mattermost and Rocket.Chat incoming webhooks (and common Matrix bridges) accept.

    OPJOURNAL_WEBHOOK__SECRET=whsec_... CHAT_WEBHOOK_URL=https://chat.example.com/hooks/... \
        python3 chat_bridge.py --listen 127.0.0.1:8088

Standard library only. The seen ids live in memory: run one instance (or keep them in a
shared store). The chat URL and the secret are never printed.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECONDS = 300
MAX_BODY_BYTES = 64 * 1024


def verify(secret: str, headers, body: bytes, tolerance: int = TOLERANCE_SECONDS) -> bool:
    """True when `body` and `headers` were signed by opjournal with `secret`."""
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        msg_id = headers["webhook-id"]
        timestamp = headers["webhook-timestamp"]
        signatures = headers["webhook-signature"]
        if msg_id is None or timestamp is None or signatures is None:
            return False
        if abs(time.time() - int(timestamp)) > tolerance:
            return False
    except (KeyError, ValueError):
        return False
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(
        hmac.compare_digest(expected, sig.removeprefix("v1,"))
        for sig in signatures.split(" ")
        if sig.startswith("v1,")
    )


def chat_text(event: dict) -> str:
    """One chat line for an event."""
    data = event["data"]
    refs = ", ".join(f"{k}={v}" for k, v in sorted(data.get("business_references", {}).items()))
    where = f"`{data['action_type']}` `{data['operation_key']}` in `{data['namespace']}`"
    if event["type"] == "operation.review_required":
        line = (f":rotating_light: review required — {where} ({data.get('reason')}), "
                f"attempt {data['attempt']}")
    elif event["type"] == "operation.review_resolved":
        who = data.get("reviewer") or data.get("resolved_by")
        line = (f":white_check_mark: review resolved — {where}: {data.get('resolution')} "
                f"by {who} ({data.get('reason')})")
    else:
        line = f"{event['type']} — {where}"
    return f"{line}, {refs}" if refs else line


class Bridge(BaseHTTPRequestHandler):
    secret = ""
    chat_url = ""
    seen = set()
    lock = threading.Lock()

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return self.answer(413)
        body = self.rfile.read(length)
        if not verify(self.secret, self.headers, body):
            return self.answer(401)
        event_id = self.headers["webhook-id"]
        with self.lock:
            if event_id in self.seen:
                return self.answer(204)  # a repeat: already posted
        try:
            text = chat_text(json.loads(body))
            request = urllib.request.Request(
                self.chat_url,
                data=json.dumps({"text": text}).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                response.read()
        except Exception as error:  # the chat is down: let opjournal retry
            print(f"event {event_id}: chat post failed: {type(error).__name__}", file=sys.stderr)
            return self.answer(502)
        with self.lock:
            self.seen.add(event_id)
        print(f"event {event_id}: posted", flush=True)
        return self.answer(204)

    def answer(self, status: int):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):  # no request lines (they would carry nothing useful)
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8088", help="host:port to listen on")
    args = parser.parse_args()
    Bridge.secret = os.environ["OPJOURNAL_WEBHOOK__SECRET"]
    Bridge.chat_url = os.environ["CHAT_WEBHOOK_URL"]
    host, port = args.listen.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), Bridge)
    print(f"chat bridge listening on {server.server_address[0]}:{server.server_address[1]}",
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
