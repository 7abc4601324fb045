"""The switch core, split as bmv2's bm_sim is: what a packet holds (packet), where its fields live
(layout), what the JSON declares (loader), expressions, calculations and checksums, actions, parser,
deparser, match-action pipelines, and the generated-source backend (codegen) that stands in for the
closure interpreter where it can. The v1model loop over these parts is dpu_softswitch.v1model; dpu_softswitch.program
assembles one program from them.
"""
