"""HTTP/1.1 on the wire, byte by byte, against the real server: pipelining, Expect: 100-continue, the
header size limit and malformed requests, each followed by proof that the server goes on serving."""

from __future__ import annotations

import socket

import orjson

from tests.support import ServerProcess, request

INFER = {
    "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}],
}


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read ``count`` complete responses (Content-Length framed) from ``sock``."""
    data = b""
    responses = []
    while len(responses) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {len(responses)} responses"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection in the middle of a body"
            data += chunk
        responses.append((status, headers, data[:length]))
        data = data[length:]
    return responses


def still_serving(server: ServerProcess) -> None:
    assert request(server.port, "POST", "/v2/models/simple/infer", INFER).status == 200


def test_pipelined_requests_are_answered_in_order(example_server: ServerProcess):
    bodies = [orjson.dumps({**INFER, "id": f"p{index}"}) for index in range(3)]
    wire = b"".join(post("/v2/models/simple/infer", body) for body in bodies)
    wire += b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n"
    with socket.create_connection(("127.0.0.1", example_server.port), timeout=10) as sock:
        sock.sendall(wire)  # four requests in one write, before any answer
        responses = read_responses(sock, 4)
    assert [status for status, _, _ in responses] == [200] * 4
    assert [orjson.loads(body).get("id") for _, _, body in responses[:3]] == ["p0", "p1", "p2"]
    assert orjson.loads(responses[3][2]) == {"live": True}


def test_expect_100_continue_gets_the_interim_answer_first(example_server: ServerProcess):
    body = orjson.dumps(INFER)
    with socket.create_connection(("127.0.0.1", example_server.port), timeout=10) as sock:
        head = (
            "POST /v2/models/simple/infer HTTP/1.1\r\nHost: test\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
        )
        sock.sendall(head.encode())  # the headers alone: the client waits for the go-ahead
        interim = sock.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        [(status, _, answer)] = read_responses(sock, 1)
    assert status == 200
    assert orjson.loads(answer)["model_name"] == "simple"


def test_headers_over_the_limit_get_431(example_server: ServerProcess):
    huge = "X-Padding: " + "a" * 70_000
    with socket.create_connection(("127.0.0.1", example_server.port), timeout=10) as sock:
        sock.sendall(post("/v2/models/simple/infer", orjson.dumps(INFER), huge))
        [(status, headers, body)] = read_responses(sock, 1)
    assert status == 431
    assert headers["connection"] == "close"
    assert orjson.loads(body)["error"] == (
        "request line and headers exceed 65536 bytes (server.limits.max_header_bytes)"
    )
    still_serving(example_server)


def test_a_request_target_that_is_not_a_url_gets_400_naming_it(example_server: ServerProcess):
    """The target passes the request line's parse and fails when split into path and query; the answer
    names it (httptools alone would say only "callback error"), with a GET and with a body."""
    for wire in (
        b"GET http://[bad HTTP/1.1\r\nHost: test\r\n\r\n",
        post("http://[bad", orjson.dumps(INFER)),
    ):
        with socket.create_connection(("127.0.0.1", example_server.port), timeout=10) as sock:
            sock.sendall(wire)
            [(status, _, body)] = read_responses(sock, 1)
        assert status == 400
        assert orjson.loads(body)["error"] == "malformed HTTP request: invalid url b'http://[bad'"
    still_serving(example_server)


def test_malformed_http_gets_400_and_the_server_goes_on(example_server: ServerProcess):
    for garbage in (
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /v2 HTTP/1.1\r\nHost test\r\n\r\n",
        b"\x16\x03\x01\x02\x00",
    ):
        with socket.create_connection(("127.0.0.1", example_server.port), timeout=10) as sock:
            sock.sendall(garbage)
            [(status, _, body)] = read_responses(sock, 1)
        assert status == 400
        assert orjson.loads(body)["error"].startswith("malformed HTTP request")
    still_serving(example_server)
