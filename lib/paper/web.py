"""JSON over HTTP with the standard library: the one request every client here makes (the engines' OpenAI-compatible
server, Search-R1's retriever, the judge, the openai proposer, the preflight's /models check).

    reply = request_json(url, {"queries": [...]}, key=None, timeout=30)   # POST a JSON body; GET when body is None

Errors are urllib's, for each caller to name its fix: HTTPError (a status; its body says why), URLError or
OSError (refused, reset, timed out); request_json adds ValueError (a reply that is not JSON).
"""
import json
import urllib.error
import urllib.request

HTTPError, URLError = urllib.error.HTTPError, urllib.error.URLError


def request(url, body=None, *, key=None, timeout=60.0):
    """-> the reply's bytes: POST `body` as JSON, or GET when it is None; `key` as a bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as resp:
        return resp.read()


def request_json(url, body=None, *, key=None, timeout=60.0):
    """request(), its reply read as JSON."""
    return json.loads(request(url, body, key=key, timeout=timeout))
