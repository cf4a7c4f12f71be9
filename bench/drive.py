"""A fixed number of sequential requests over one keep-alive connection, for
instruction counts (bench/run.sh callgrind): python3 bench/drive.py BASE N ROUTE.

ROUTE: contact (POST /api/contact, a distinct X-Forwarded-For each, as
bench/contact.lua) or health (GET /api/health). Prints how many answered 2xx.
"""
import http.client
import json
import sys
import urllib.parse

base, n, route = sys.argv[1], int(sys.argv[2]), sys.argv[3]
u = urllib.parse.urlsplit(base)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
ok = 0
for i in range(n):
    if route == "contact":
        body = json.dumps({"name": f"Bench {i}", "email": f"bench{i}@example.com", "message": "Hello from wrk"})
        ip = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        conn.request("POST", "/api/contact", body, {"Content-Type": "application/json", "X-Forwarded-For": ip})
    elif route == "health":
        conn.request("GET", "/api/health")
    else:
        sys.exit(f"unknown route {route}")
    r = conn.getresponse()
    r.read()
    ok += 200 <= r.status < 300
print(f"{route}: {ok} of {n} answered 2xx")
