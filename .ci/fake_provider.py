#!/usr/bin/env python3
"""A minimal stand-in for the payment providers' checkout APIs, for the
contract fuzzer (.ci/schemathesis.sh): answers the documented success shapes
so POST /api/payments can answer 200 without the providers' sandboxes.

  POST /snap/v1/transactions -> 201 {token, redirect_url}            (provider_a)
  POST /checkout/v1/payment  -> 200 {message: ["SUCCESS"], response} (provider_b)

Listens on 127.0.0.1, an ephemeral port; prints `listening on http://HOST:PORT`.
It checks nothing: the black-box tests (tests/tests/checkout.rs) check the
requests' auth and signatures.
"""
import json
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            req = {}
        token = str(uuid.uuid4())
        if self.path == "/snap/v1/transactions":
            status, answer = 201, {
                "token": token,
                "redirect_url": f"https://app.sandbox.midtrans.com/snap/v4/redirection/{token}",
            }
        elif self.path == "/checkout/v1/payment":
            order = req.get("order") or {}
            status, answer = 200, {
                "message": ["SUCCESS"],
                "response": {
                    "order": {
                        "amount": str(order.get("amount", "")),
                        "invoice_number": order.get("invoice_number", ""),
                        "currency": order.get("currency", "IDR"),
                    },
                    "payment": {
                        "payment_due_date": (req.get("payment") or {}).get("payment_due_date", 60),
                        "token_id": token,
                        "url": f"https://sandbox.doku.com/checkout-link-v2/{token}",
                        "expired_date": "20991231235959",
                    },
                },
            }
        else:
            status, answer = 404, {"message": ["NOT FOUND"]}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
