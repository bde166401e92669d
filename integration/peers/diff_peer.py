#!/usr/bin/env python3
"""The differential peer (issue 27): the same hostile requests, sent by HTTP/2
clients that are not Rust's (gRPC C-core through `grpcio`, and the Python `h2`
library driving raw frames the way grpc-go frames them), to one socket. The
Rust test (integration/tests/differential.rs) runs it once against containerd
directly and once through qoslet and compares the outcomes case by case.

    diff_peer.py SOCKET CONTAINER_ID SANDBOX_ID [CASE_PREFIX]

Each case runs on a connection of its own on which a 2 s ExecSync (`sleep 2`
in CONTAINER_ID) is started first: the case's outcome and whether that
ExecSync, in flight on the same connection, still ended with exit code 0 are
printed, one JSON object per line:
    {"case": ..., "outcome": "grpc:NOT_FOUND" | "reset:1" | "http:431" | ..., "exec": true|false}
"""

import os
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events

# the protobuf and gRPC framing helpers of the other peer, in the same directory
from h2_peer import grpc_frame, ld, out, varint

EXEC = "/runtime.v1.RuntimeService/ExecSync"
VERSION = "/runtime.v1.RuntimeService/Version"
STATUS = "/runtime.v1.RuntimeService/ContainerStatus"
PULL = "/runtime.v1.ImageService/PullImage"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
RUNPOD = "/runtime.v1.RuntimeService/RunPodSandbox"
KiB, MiB = 1 << 10, 1 << 20


def vi(field, n):
    return varint(field << 3) + varint(n)


def exec_request(cid):
    # ExecSyncRequest{container_id, cmd: [sleep, 2], timeout: 10}
    return ld(1, cid.encode()) + ld(2, b"sleep") + ld(2, b"2") + vi(3, 10)


def exec_ok(answer):
    # ExecSyncResponse: exit_code is field 3; absent means 0
    i = 0
    while i < len(answer):
        key = answer[i]
        i += 1
        if key == 0x18:
            return answer[i] == 0
        if key & 7 == 2:
            n, shift = 0, 0
            while True:
                b = answer[i]
                i += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            i += n
        else:
            while answer[i] & 0x80:
                i += 1
            i += 1
    return True


# ---- gRPC C-core ----

KUBELET = [("grpc.max_metadata_size", 16 * MiB), ("grpc.absolute_max_metadata_size", 16 * MiB)]


def grpcio_case(sock, cid, name, method, payload, options=(), metadata=None):
    import grpc

    opts = [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        ("grpc.default_authority", "localhost"),
    ] + list(options)
    ch = grpc.insecure_channel("unix://" + sock, options=opts)
    raw = lambda m: ch.unary_unary(m, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    ex = raw(EXEC).future(exec_request(cid), timeout=30)
    time.sleep(0.2)  # the ExecSync is on the wire, in flight
    try:
        raw(method)(payload, timeout=60, metadata=metadata)
        outcome = "grpc:OK"
    except grpc.RpcError as e:
        outcome = "grpc:" + e.code().name
        details = e.details() or ""
    else:
        details = ""
    try:
        ok = exec_ok(ex.result())
    except grpc.RpcError as e:
        ok = False
        details += " / exec: " + e.code().name + " " + (e.details() or "")[:200]
    ch.close()
    out(case=name, outcome=outcome, exec=ok, details=details[:120], details_len=len(details))


# ---- raw HTTP/2 (python h2), framed as grpc-go frames: 16 KiB ----

def base_headers(path):
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"localhost"),
        (b":path", path.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]


def send_request(c, sid, headers, body, ending):
    """Sends one request on stream `sid`, its body ended the way `ending` says
    (issue 48: each ending is answered differently by the runtime, and qoslet
    must forward it as it came):
      data          the body, END_STREAM on its last DATA frame
      headers       END_STREAM on the HEADERS: no body at all
      empty-data    the body (may be b""), then an empty DATA frame with END_STREAM
      padded-empty  the body, then an empty DATA frame with 16 bytes of padding and END_STREAM
      trailers      the body (may be b""), then trailers (HEADERS with END_STREAM)
      reset         the body, an empty DATA frame with END_STREAM, then RST_STREAM CANCEL
      open          the body, and the stream left open (no END_STREAM, nothing more)
    """
    if ending == "headers":
        c.send_headers(sid, headers, end_stream=True)
        return
    c.send_headers(sid, headers)
    if ending == "data":
        c.send_data(sid, body, end_stream=True)
        return
    if body:
        c.send_data(sid, body)
    if ending == "open":
        return
    if ending == "trailers":
        c.send_headers(sid, [(b"x-trailer", b"1")], end_stream=True)
    elif ending == "padded-empty":
        c.send_data(sid, b"", end_stream=True, pad_length=16)
    else:
        c.send_data(sid, b"", end_stream=True)
        if ending == "reset":
            c.reset_stream(sid, 8)


def h2_case(sock, cid, name, headers, body=grpc_frame(b""), ending="data", wait=30):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    cfg = h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
        validate_inbound_headers=False,
    )
    c = h2.connection.H2Connection(cfg)
    c.initiate_connection()
    enc = c.encoder.encode
    c.encoder.encode = lambda hs, huffman=True: enc(hs, huffman=False)  # MiBs of Huffman in Python is slow
    s.sendall(c.data_to_send())
    answers = {}

    def pump(until, timeout):
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            s.settimeout(left)
            try:
                d = s.recv(1 << 20)
            except (socket.timeout, ConnectionResetError):
                return
            if not d:
                answers["eof"] = True
                return
            for ev in c.receive_data(d):
                a = answers.setdefault(getattr(ev, "stream_id", 0), {"data": b""})
                if isinstance(ev, h2.events.ResponseReceived):
                    h = dict(ev.headers)
                    a["http"] = h.get(b":status")
                    if b"grpc-status" in h:
                        a["grpc"] = h[b"grpc-status"]
                elif isinstance(ev, h2.events.TrailersReceived):
                    a["grpc"] = dict(ev.headers).get(b"grpc-status")
                elif isinstance(ev, h2.events.DataReceived):
                    a["data"] += ev.data
                    c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamReset):
                    a["reset"] = int(ev.error_code)
                elif isinstance(ev, h2.events.StreamEnded):
                    a["ended"] = True
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    answers["goaway"] = int(ev.error_code)
            try:
                s.sendall(c.data_to_send())
            except OSError:
                return

    pump(lambda: False, 0.2)  # the server's SETTINGS
    c.max_outbound_frame_size = 16 * KiB  # grpc-go's frames, whatever the peer allows
    ex = c.get_next_available_stream_id()
    c.send_headers(ex, base_headers(EXEC))
    c.send_data(ex, grpc_frame(exec_request(cid)), end_stream=True)
    s.sendall(c.data_to_send())
    time.sleep(0.2)
    sid = c.get_next_available_stream_id()
    try:
        send_request(c, sid, headers, body, ending)
        s.sendall(c.data_to_send())
    except OSError as e:
        answers["send_error"] = type(e).__name__
    done = lambda n: n in answers and ("reset" in answers[n] or answers[n].get("ended") or "grpc" in answers[n])
    # a stream that gets no answer either way (no deadline, or reset by the client)
    # is waited on for `wait` seconds; the ExecSync still gets its full 30 s
    t_case = time.monotonic()
    pump(lambda: done(sid) and done(ex) or "goaway" in answers or (done(ex) and time.monotonic() - t_case > wait), 30)
    a = answers.get(sid, {})
    if "reset" in a and not ("grpc" in a and a["reset"] == 0):
        # (RST_STREAM NO_ERROR after a whole answer only closes a stream the client left open)
        outcome = "reset:%d" % a["reset"]
    elif "grpc" in a:
        outcome = "grpc:%s" % a["grpc"].decode()
    elif "http" in a:
        outcome = "http:%s" % a["http"].decode()
    elif "goaway" in answers:
        outcome = "goaway:%d" % answers["goaway"]
    else:
        outcome = "none" + (" (%s)" % answers["send_error"] if "send_error" in answers else "")
    e = answers.get(ex, {})
    ok = e.get("grpc") == b"0" and exec_ok(e["data"][5:])
    s.close()
    out(case=name, outcome=outcome, exec=ok)


def cases(cid, sandbox):
    h = base_headers(VERSION)
    meta = ld(1, b"diff") + ld(2, b"uid-diff") + ld(3, b"default")
    # grpcio, as kubelet sets its metadata limit (16 MiB) and with C-core's defaults (16 KiB)
    for n in (100 * KiB, 340 * KiB, 1 * MiB, 15 * MiB):
        yield "trailers-status-id-%d" % n, ("grpcio", STATUS, ld(1, b"a" * n), KUBELET)
        yield "trailers-status-id-%d-small-limit" % n, ("grpcio", STATUS, ld(1, b"a" * n), ())
    yield "trailers-pull-image-600k", ("grpcio", PULL, ld(1, ld(1, b"b" * (600 * KiB))), KUBELET)
    # an intercepted call: CreateContainer of a real pod, an image name of 600 KiB
    create = ld(1, sandbox.encode()) + ld(2, ld(1, ld(1, b"app")) + ld(2, ld(1, b"c" * (600 * KiB)))) + ld(3, ld(1, meta))
    yield "trailers-create-image-600k", ("grpcio", CREATE, create, KUBELET)
    for n in (100 * KiB, 1 * MiB, 15 * MiB):
        yield "request-metadata-%d" % n, ("grpcio", VERSION, b"", KUBELET, [("x-big", "m" * n)])
    # missing metadata the runtime answers itself
    yield "missing-pod-metadata", ("grpcio", RUNPOD, ld(1, ld(3, b"host")), KUBELET)
    yield "missing-container-metadata", ("grpcio", CREATE, ld(1, sandbox.encode()) + ld(2, ld(2, ld(1, b"x"))) + ld(3, ld(1, meta)), KUBELET)
    # raw frames: header blocks in 16 KiB frames, as grpc-go sends them
    for n in (100 * KiB, 320 * KiB, 1 * MiB, 15 * MiB):
        yield "request-block-16k-frames-%d" % n, ("h2", h + [(b"x-big", b"m" * n)])
    # streams the runtime resets
    yield "reset-no-content-type", ("h2", [x for x in h if x[0] != b"content-type"])
    yield "reset-bad-grpc-timeout", ("h2", h + [(b"grpc-timeout", b"xyz")])
    # malformed requests (RFC 9113 8.1.1: a stream error)
    yield "malformed-uppercase-name", ("h2", h + [(b"X-Upper", b"v")])
    yield "malformed-unknown-pseudo", ("h2", h[:1] + [(b":foo", b"bar")] + h[1:])
    yield "malformed-empty-name", ("h2", h + [(b"", b"v")])
    yield "malformed-space-in-name", ("h2", h + [(b"a b", b"v")])
    yield "malformed-control-in-value", ("h2", h + [(b"x-a", b"a\x01b")])
    # malformed requests containerd answers and h2 resets (RFC 9113 8.2.2, 8.3.1): qoslet is
    # stricter here, by h2's rules; the test checks the stream error and the ExecSync only
    yield "strict-connection-header", ("h2", h + [(b"connection", b"close")])
    yield "strict-te-gzip", ("h2", [x for x in h if x[0] != b"te"] + [(b"te", b"gzip")])
    yield "strict-no-path", ("h2", [x for x in h if x[0] != b":path"])
    yield "strict-bad-method", ("h2", [(b":method", b"P OST")] + h[1:])
    # issue 48: every way a request body can end, for a passed-through call (Version),
    # an intercepted one (CreateContainer) and a service the runtime does not serve (a
    # streaming pass-through): each forwarded as it came, so answered as direct answers it. An empty body ended by an empty DATA frame is UNKNOWN at once; a
    # body that ends on its HEADERS waits for its deadline (grpc-go), so it carries one;
    # trailers from a client are a stream error.
    paths = [("version", VERSION), ("create", CREATE), ("unknown", "/qoslet.test.Nothing/Call")]
    yield "end-version-padded-empty-data", ("h2", h, b"", "padded-empty")
    for tag, path in paths:
        hp = base_headers(path)
        yield "end-%s-empty-data" % tag, ("h2", hp, b"", "empty-data")
        yield "end-%s-message-then-empty-data" % tag, ("h2", hp, grpc_frame(b""), "empty-data")
        yield "end-%s-headers-deadline" % tag, ("h2", hp + [(b"grpc-timeout", b"1S")], b"", "headers")
        if tag == "unknown":
            # (a streamed call goes to the runtime frame by frame: whether containerd
            # answers UNIMPLEMENTED before it sees the client's trailers is a race,
            # direct and through qoslet alike)
            continue
        yield "end-%s-trailers-only" % tag, ("h2", hp, b"", "trailers")
        yield "end-%s-message-then-trailers" % tag, ("h2", hp, grpc_frame(b""), "trailers")
    # the stream left open: a whole message is answered (grpc-go does not wait for
    # END_STREAM), part of one or none waits for the deadline
    for tag, path in paths[:2]:
        hp = base_headers(path)
        yield "open-%s-message" % tag, ("h2", hp, grpc_frame(b""), "open")
        yield "open-%s-part-deadline" % tag, ("h2", hp + [(b"grpc-timeout", b"1S")], grpc_frame(b"abc")[:3], "open")
        yield "open-%s-nothing-deadline" % tag, ("h2", hp + [(b"grpc-timeout", b"1S")], b"", "open")
    # no deadline and no body: grpc-go waits for ever, so does the call through qoslet
    # (answered neither way within 2 s); a client reset: no answer either way
    yield "end-version-headers-no-deadline", ("h2", h, b"", "headers", 2)
    yield "end-version-reset-after-empty-data", ("h2", h, b"", "reset", 2)


def main():
    sock, cid, sandbox = sys.argv[1], sys.argv[2], sys.argv[3]
    prefix = sys.argv[4] if len(sys.argv) > 4 else ""
    for name, spec in cases(cid, sandbox):
        if not name.startswith(prefix):
            continue
        if spec[0] == "grpcio":
            _, method, payload, opts, *md = spec
            grpcio_case(sock, cid, name, method, payload, opts, md[0] if md else None)
        else:
            h2_case(sock, cid, name, *spec[1:])


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    main()
