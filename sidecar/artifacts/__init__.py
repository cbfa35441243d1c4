"""Everything the project generates from its configuration.

- :mod:`.params`: the parameters (thresholds, rule parameters) and the names artifacts share
  (dashboard uids and variables);
- :mod:`.rules`: the Prometheus alerting and recording rules;
- :mod:`.formatting`: thresholds as PromQL numbers and percentages (rules and dashboards);
- :mod:`.dashboards`: the Grafana dashboards (a panel kit and one module per dashboard);
- :mod:`.kubernetes`: the Kubernetes objects of ``deploy/`` (the sidecar container and patches,
  ConfigMaps, the report ``CronJob``, the ``PrometheusRule``);
- :mod:`.deploy`: the generated files of ``deploy/`` (components, report, overlays);
- :mod:`.files`: stable YAML/JSON text and atomic writes;
- :mod:`.docs`: the generated documentation (metric table, configuration reference, example config);
- :mod:`.cli`: ``kv-sidecar rules render``;
- :mod:`.generate`: ``make generate``, which rewrites every generated file the repository commits.
"""
