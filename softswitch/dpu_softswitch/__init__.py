"""dpu_softswitch: an embedded P4 software target that runs compiled bmv2 JSON and serves P4Runtime.

It is a second implementation of bmv2's simple_switch_grpc for v1model programs: the same
JSON, the same P4Runtime service, the same packet semantics (meters, counters, drops), so
that the lab and the tests run on any machine after one pip install.

Its parts follow bmv2's: switch/ is bm_sim (packet, layout, loader, expressions, calculations,
actions, parsing, deparsing, pipeline, and codegen, the generated-source backend); program.py
assembles one program from them; v1model.py is targets/simple_switch's packet loop; runtime/ is
the P4Runtime side, one module per entity kind; device.py is a device and server.py its gRPC service.
"""
