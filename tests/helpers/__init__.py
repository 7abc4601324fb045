"""What the tests share: paths, processes, planes, scenarios, namespaces, P4Runtime and bmv2 helpers."""
