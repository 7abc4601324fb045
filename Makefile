# Developer targets. The control plane needs only `pip install .`, the lab `pip install '.[lab]'`, the tests
# `pip install '.[test]'`; p4c is needed only to recompile p4/.
P4C ?= p4c-bm2-ss
P4_SOURCES := $(wildcard p4/*.p4)

.PHONY: p4 lint test
p4: $(P4_SOURCES:.p4=.json)

# Compiled artifacts are committed beside their source (as ONOS does); tests/test_p4_artifacts.py
# fails when they are stale and p4c is installed.
# p4c runs inside p4/ so that the source paths it records do not depend on the checkout's location.
p4/%.json: p4/%.p4
	cd p4 && $(P4C) --arch v1model --std p4-16 --p4runtime-files $*.p4info.txtpb -o $*.json $*.p4

lint:
	ruff check . && ruff format --check . && mypy

test:
	pytest
