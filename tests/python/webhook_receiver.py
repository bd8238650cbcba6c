"""A webhook receiver that verifies every delivery with the real `standardwebhooks`
library (PyPI) and prints one JSON line per delivery: {"ok": bool, "id", "event", "t"}.

argv: port file, secret, mode (`ok` | `first-429-date`: answer the first delivery 429 with
an HTTP-date Retry-After 2 s ahead, then 200).
"""

import email.utils
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

port_file, secret, mode = sys.argv[1], sys.argv[2], sys.argv[3]
hook = Webhook(secret)
seen = {"n": 0}


class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            hook.verify(body, headers)
            ok = True
        except Exception as e:  # noqa: BLE001 - any verification failure is reported
            ok = False
            print(json.dumps({"ok": False, "error": str(e)}), flush=True)
        seen["n"] += 1
        if ok:
            print(json.dumps({"ok": True, "id": headers.get("webhook-id"), "ts": headers.get("webhook-timestamp"),
                              "event": json.loads(body).get("event"), "t": time.time()}), flush=True)
        if mode == "first-429-date" and seen["n"] == 1:
            self.send_response(429)
            self.send_header("Retry-After", email.utils.formatdate(time.time() + 3, usegmt=True))
            self.end_headers()
            return
        self.send_response(200 if ok else 400)
        self.end_headers()

    def log_message(self, *a):
        pass


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(port_file, "w") as f:
    f.write(str(srv.server_address[1]))
srv.serve_forever()
