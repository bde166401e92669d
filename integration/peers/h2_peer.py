#!/usr/bin/env python3
"""Strict HTTP/2 peers for qoslet's data-plane tests (issue 11), written with
HTTP/2 implementations other than Rust's h2: the Python `h2` library driving
raw frames, and gRPC C-core (`grpcio`). Each scenario prints one JSON object
on stdout for the Rust test that runs it (integration/tests/peers.rs).

    h2_peer.py SOCKET SCENARIO [ARGS...]

Scenarios:
  reset-held            24 CreateContainer calls whose bodies stop at 1 MiB and are reset
                        (24 MiB, more than any window), then 10 Version calls and 10 calls
                        with a 30 KB body on the same connection; reports the answers
  continuation-flood    HEADERS without END_HEADERS, then CONTINUATION frames (20 MiB in
                        all); reports how the server ended it and how fast
  small-header-table    SETTINGS_HEADER_TABLE_SIZE 0, then 20 Version calls
  concurrent N          N Version calls open at once on one connection
  slow-reader PATH      one call whose answer is never read (no WINDOW_UPDATE); reports
                        when a GOAWAY arrives (the test sends SIGTERM to qoslet meanwhile)
  goaway-server         (SOCKET is where it listens) a runtime that turns the first Version
                        call away with GOAWAY and answers the rest with an empty OK
  grpcio-unary PATH HEX|@FILE [hex]
                        one unary call through gRPC C-core; reports its code, the answer's
                        size (and, with `hex`, the answer)
"""

import json
import socket
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

VERSION = "/runtime.v1.RuntimeService/Version"
CREATE = "/runtime.v1.RuntimeService/CreateContainer"
LIST = "/runtime.v1.RuntimeService/ListContainers"


def out(**kv):
    print(json.dumps(kv), flush=True)


def varint(n):
    b = bytearray()
    while True:
        if n < 0x80:
            b.append(n)
            return bytes(b)
        b.append((n & 0x7F) | 0x80)
        n >>= 7


def ld(field, payload):
    """A length-delimited protobuf field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def grpc_frame(payload):
    return struct.pack(">?I", False, len(payload)) + payload


def headers(path):
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", path),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


class Peer:
    def __init__(self, path, settings=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(10)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.flush()
        self.answers = {}  # stream -> {"status": grpc-status, "bytes": n}
        self.goaway = None

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, until, timeout=10.0):
        """Reads and handles events until `until()` is true; False on timeout/EOF."""
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return False
            if not data:
                return False
            for ev in self.conn.receive_data(data):
                self.handle(ev)
            self.flush()
        return True

    def handle(self, ev):
        if isinstance(ev, h2.events.DataReceived):
            a = self.answers.setdefault(ev.stream_id, {"status": None, "bytes": 0})
            a["bytes"] += len(ev.data)
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
            a = self.answers.setdefault(ev.stream_id, {"status": None, "bytes": 0})
            for k, v in ev.headers:
                if k == "grpc-status":
                    a["status"] = int(v)
        elif isinstance(ev, h2.events.StreamReset):
            a = self.answers.setdefault(ev.stream_id, {"status": None, "bytes": 0})
            a["reset"] = int(ev.error_code)
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = {"error": int(ev.error_code), "last": ev.last_stream_id}

    def send(self, sid, data, end_stream):
        """Sends `data` in frames the peer allows, waiting for window as needed."""
        while True:
            room = min(
                self.conn.local_flow_control_window(sid),
                self.conn.max_outbound_frame_size,
                len(data),
            )
            if room == 0 and data:
                if not self.pump(lambda: self.conn.local_flow_control_window(sid) > 0, timeout=10):
                    raise TimeoutError(f"no send window for stream {sid}")
                continue
            last = room == len(data)
            self.conn.send_data(sid, data[:room], end_stream=end_stream and last)
            self.flush()
            data = data[room:]
            if last:
                return

    def unary(self, path, payload):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, headers(path))
        self.send(sid, grpc_frame(payload), True)
        return sid

    def done(self, sid):
        a = self.answers.get(sid)
        return a is not None and (a["status"] is not None or "reset" in a)


def reset_held(path):
    p = Peer(path)
    p.pump(lambda: False, timeout=0.3)  # the server's SETTINGS and window first
    # 24 CreateContainer bodies announced at 2 MiB, each reset after 1 MiB: 24 MiB
    # sent in all, more than any window qoslet opens (16 MiB), so this only goes
    # through if qoslet credits back what reset streams held
    for _ in range(24):
        sid = p.conn.get_next_available_stream_id()
        p.conn.send_headers(sid, headers(CREATE))
        p.send(sid, struct.pack(">?I", False, 2 << 20) + b"\x0a" * (1 << 20), False)
        p.conn.reset_stream(sid, error_code=8)  # CANCEL
        p.flush()
    time.sleep(0.3)
    p.pump(lambda: False, timeout=0.5)  # take the WINDOW_UPDATEs the server sends
    calls = [p.unary(VERSION, b"") for _ in range(10)]
    # calls with a body that needs the window: ListContainers with a 30 KB label selector
    entry = ld(1, b"key") + ld(2, b"v" * 30000)
    msg = ld(1, ld(4, entry))  # ListContainersRequest.filter.label_selector
    big = [p.unary(LIST, msg) for _ in range(10)]
    ok = p.pump(lambda: all(p.done(s) for s in calls + big), timeout=20)
    out(
        all_answered=ok,
        version_ok=sum(1 for s in calls if p.answers.get(s, {}).get("status") == 0),
        big_answered=sum(1 for s in big if p.done(s)),
        big_statuses=sorted({str(p.answers.get(s, {}).get("status")) for s in big}),
        send_window=p.conn.outbound_flow_control_window,
    )


def continuation_flood(path):
    p = Peer(path)
    p.pump(lambda: False, timeout=0.2)
    sid = p.conn.get_next_available_stream_id()
    # a HEADERS frame without END_HEADERS, then CONTINUATIONs of junk, by hand
    block = p.conn.encoder.encode(headers(VERSION))
    frame = lambda t, f, s, payload: struct.pack(">I", len(payload))[1:] + bytes([t, f]) + struct.pack(">I", s) + payload
    t0 = time.monotonic()
    sent = 0
    ended = None
    try:
        p.sock.sendall(frame(0x1, 0x0, sid, block))
        chunk = frame(0x9, 0x0, sid, b"\x00" * 16000)
        while sent < 20 << 20:
            p.sock.sendall(chunk)
            sent += 16000
    except (BrokenPipeError, ConnectionResetError) as e:
        ended = type(e).__name__
    # what the server said, if anything
    p.sock.settimeout(5)
    got = b""
    try:
        while True:
            d = p.sock.recv(65536)
            if not d:
                break
            got += d
    except (socket.timeout, ConnectionResetError):
        pass
    goaway = None
    i = 0
    while i + 9 <= len(got):
        ln = int.from_bytes(got[i:i + 3], "big")
        if got[i + 3] == 0x7 and i + 9 + 8 <= len(got):
            goaway = int.from_bytes(got[i + 13:i + 17], "big")
        i += 9 + ln
    out(sent=sent, ended=ended, goaway_error=goaway, seconds=round(time.monotonic() - t0, 3))


def small_header_table(path):
    p = Peer(path, {h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0})
    calls = []
    for _ in range(20):
        s = p.unary(VERSION, b"")
        calls.append(s)
        p.pump(lambda: p.done(s))
    out(ok=sum(1 for s in calls if p.answers.get(s, {}).get("status") == 0))


def concurrent(path, n):
    p = Peer(path)
    p.pump(lambda: False, timeout=0.2)
    calls = [p.unary(VERSION, b"") for _ in range(n)]
    ok = p.pump(lambda: all(p.done(s) for s in calls), timeout=30)
    out(all_answered=ok, ok=sum(1 for s in calls if p.answers.get(s, {}).get("status") == 0))


def slow_reader(path, method):
    # a small window: the answer (MiBs) stops at 64 KiB and is never read further
    p = Peer(path, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
    sid = p.conn.get_next_available_stream_id()
    p.conn.send_headers(sid, headers(method))
    p.conn.send_data(sid, grpc_frame(b""), end_stream=True)
    p.flush()
    # no acknowledge_received_data: nothing is credited back. From here on the
    # frames are read raw (a GOAWAY may be followed by a PING, which the h2
    # library refuses on a connection it already considers closed)
    buf = b""
    data = 0
    goaway = None
    started = False
    t0 = time.monotonic()
    deadline = t0 + 30
    p.sock.settimeout(0.2)
    while goaway is None and time.monotonic() < deadline:
        try:
            got = p.sock.recv(65536)
        except socket.timeout:
            continue
        if not got:
            break
        buf += got
        while len(buf) >= 9:
            ln = int.from_bytes(buf[0:3], "big")
            if len(buf) < 9 + ln:
                break
            if buf[3] == 0x0:
                data += ln
            if buf[3] == 0x7 and ln >= 8:
                goaway = int.from_bytes(buf[13:17], "big")
            buf = buf[9 + ln:]
        if not started and data >= 60000:
            # the answer is flowing and now stalled on this client's window
            started = True
            out(started=True, data=data)
    out(goaway=goaway is not None, error=goaway, data=data)
    # stay connected, still not reading: qoslet must end the call at its drain
    # deadline, not wait for this client
    time.sleep(8)


def grpcio_unary(path, method, payload, show_hex):
    import grpc

    opts = [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        ("grpc.default_authority", "localhost"),
    ]
    ch = grpc.insecure_channel("unix://" + path, options=opts)
    call = ch.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        resp = call(payload, timeout=60)
        if show_hex:
            out(code="OK", bytes=len(resp), hex=resp.hex())
        else:
            out(code="OK", bytes=len(resp))
    except grpc.RpcError as e:
        out(code=e.code().name, details=e.details()[:200])
    ch.close()


def goaway_server(path):
    """A runtime that turns the first Version call away with GOAWAY (last stream
    id below it: never processed) and answers everything else with an empty OK
    message. Prints one JSON line per event; runs until killed."""
    import os
    import threading

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(16)
    state = {"goaway": 0, "version_ok": 0}
    lock = threading.Lock()
    out(listening=True)

    def serve(conn_sock):
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        conn.initiate_connection()
        conn_sock.sendall(conn.data_to_send())
        requests = {}
        while True:
            try:
                data = conn_sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                return
            for ev in events:
                if isinstance(ev, h2.events.RequestReceived):
                    requests[ev.stream_id] = dict(ev.headers)[":path"]
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if isinstance(ev, h2.events.StreamEnded) or (
                    isinstance(ev, h2.events.RequestReceived) and ev.stream_ended
                ):
                    sid = ev.stream_id
                    p = requests.get(sid, "")
                    with lock:
                        refuse = p == VERSION and state["goaway"] == 0
                        if refuse:
                            state["goaway"] += 1
                        elif p == VERSION:
                            state["version_ok"] += 1
                    if refuse:
                        conn.close_connection(error_code=0, last_stream_id=max(0, sid - 2))
                        conn_sock.sendall(conn.data_to_send())
                        out(goaway_sent=True, refused_stream=sid)
                        time.sleep(0.2)
                        conn_sock.close()
                        return
                    conn.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
                    conn.send_data(sid, grpc_frame(b""))
                    conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
                    if p == VERSION:
                        out(version_answered=sid)
            conn_sock.sendall(conn.data_to_send())

    while True:
        c, _ = lsock.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def main():
    path, scenario, *args = sys.argv[1:]
    if scenario == "reset-held":
        reset_held(path)
    elif scenario == "continuation-flood":
        continuation_flood(path)
    elif scenario == "small-header-table":
        small_header_table(path)
    elif scenario == "concurrent":
        concurrent(path, int(args[0]))
    elif scenario == "slow-reader":
        slow_reader(path, args[0])
    elif scenario == "goaway-server":
        goaway_server(path)
    elif scenario == "grpcio-unary":
        payload = open(args[1][1:], "rb").read() if args[1].startswith("@") else bytes.fromhex(args[1])
        grpcio_unary(path, args[0], payload, len(args) > 2 and args[2] == "hex")
    else:
        sys.exit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
