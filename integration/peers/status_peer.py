#!/usr/bin/env python3
"""One unary gRPC call made by gRPC C-core (Python `grpcio`), not by Rust: the
status code and message the caller gets, as grpcio reads them. The Rust test
(integration/tests/faults.rs, a hook's refusal) compares them with what the
hook sent.

    status_peer.py SOCKET METHOD HEX_BODY

Prints one JSON object: {"code": "RESOURCE_EXHAUSTED", "details": "..."}
("code": "OK" when the call succeeded).
"""

import json
import sys

import grpc


def main():
    sock, method, body = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
    with grpc.insecure_channel("unix:" + sock) as ch:
        # no (de)serializers: the body goes as given, the answer comes as bytes
        call = ch.unary_unary(method)
        try:
            call(body, timeout=20)
            out = {"code": "OK", "details": ""}
        except grpc.RpcError as e:
            out = {"code": e.code().name, "details": e.details()}
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
