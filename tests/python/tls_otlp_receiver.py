"""A real TLS OTLP trace receiver for the forwarder tests.

argv: mode (`http` | `grpc`), certificate chain PEM, private key PEM.
Listens on 127.0.0.1 (a free port), prints `port N`, then one JSON line per export:
{"spans": <count>, "x-test": <the x-test header or metadata value, or null>}.
"""

import json
import ssl
import sys
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

mode, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]


def count(req):
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


if mode == "http":

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            print(json.dumps({"spans": count(req), "x-test": self.headers.get("x-test")}), flush=True)
            out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    print("port %d" % httpd.server_address[1], flush=True)
    httpd.serve_forever()
else:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            md = dict(context.invocation_metadata())
            print(json.dumps({"spans": count(request), "x-test": md.get("x-test")}), flush=True)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    with open(cert, "rb") as c, open(key, "rb") as k:
        creds = grpc.ssl_server_credentials([(k.read(), c.read())])
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    print("port %d" % port, flush=True)
    server.wait_for_termination()
