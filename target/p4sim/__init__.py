"""p4sim: an embedded P4 software target that runs compiled bmv2 JSON and serves P4Runtime.

It is a second implementation of bmv2's simple_switch_grpc for v1model programs: the same
JSON, the same P4Runtime service, the same packet semantics (meters, counters, drops), so
that the lab and the tests run on any machine after one pip install.
"""
