"""deploy/compose.yaml's Grafana service, checked as configuration: there is no image of it on the
CI machines (no registry, no Debian package), so the files it mounts and the dashboard's
datasource are what is checked (the proxy and Prometheus run in tests/integration/)."""

from __future__ import annotations

import yaml

from tests.helpers import ROOT

DEPLOY = ROOT / "deploy"


def compose_file() -> dict[str, object]:
    loaded: dict[str, object] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def test_compose_mounts_grafanas_provisioning_and_the_dashboard_finds_its_datasource() -> None:
    services = compose_file()["services"]
    assert isinstance(services, dict)
    mounts = {v.split(":")[1]: DEPLOY / v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert (mounts["/etc/grafana/provisioning"] / "datasources" / "prometheus.yml").is_file()
    provider = yaml.safe_load(
        (mounts["/etc/grafana/provisioning"] / "dashboards" / "specproxy.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (mounts["/var/lib/grafana/dashboards"] / "specproxy.json").is_file()
    datasource = yaml.safe_load(
        (mounts["/etc/grafana/provisioning"] / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    dashboard = (mounts["/var/lib/grafana/dashboards"] / "specproxy.json").read_text()
    assert datasource["uid"] in dashboard
    assert datasource["url"].endswith(":9090") and all(
        s.get("network_mode") == "host" for s in services.values()
    ), "Grafana reaches Prometheus on the host's loopback"
