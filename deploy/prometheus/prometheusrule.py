#!/usr/bin/env python3
"""Writes deploy/k8s/prometheusrule.yaml from deploy/prometheus/happypath-rules.yaml
(the same groups, as a PrometheusRule for the Prometheus Operator).
`make deploy-check` fails when the two differ: run this after editing the rules.

  python3 deploy/prometheus/prometheusrule.py            (from the repository's root)
"""
import yaml

HEAD = """---
# The alert rules of deploy/prometheus/happypath-rules.yaml for the
# Prometheus Operator (a PrometheusRule), written by
# deploy/prometheus/prometheusrule.py: edit the rules file, then run it.
# `make deploy-check` checks that the groups here are that file's. The
# runbooks are in docs/operations.md ("Alerts"). The `release` label must be
# one your Prometheus' ruleSelector matches.
"""


class Dumper(yaml.SafeDumper):
    def increase_indent(self, flow=False, indentless=False):  # lists indented under their key (yamllint)
        return super().increase_indent(flow, False)


def text(dumper, value):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


Dumper.add_representer(str, text)
rules = yaml.safe_load(open("deploy/prometheus/happypath-rules.yaml"))
doc = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
    "metadata": {"name": "happypath", "labels": {"app.kubernetes.io/name": "happypath", "release": "prometheus"}},
    "spec": rules,
}
with open("deploy/k8s/prometheusrule.yaml", "w") as f:
    f.write(HEAD + yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=120))
