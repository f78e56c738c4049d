"""AtomicUpgrades against the Kubernetes API stand-in: a first install is not atomic; the first upgrade
after Helm has a deployed revision is; nothing is asked while the release does not change."""

from providers.helm_release_mode import AtomicUpgradesProvider
from tests.stand_ins.kubernetes_api import SECRETS_PATH, StandInApi, helm_release_secret

CILIUM = "cilium"
SELECTOR = "labelSelector=owner%3Dhelm%2Cname%3Dcilium%2Cstatus%3Ddeployed"


def _props(kubeconfig, release_sha256="values-1"):
    return {"kubeconfig": kubeconfig, "namespace": "kube-system", "release": CILIUM, "release_sha256": release_sha256}


def test_a_first_install_is_not_atomic_and_asks_nothing():
    api = StandInApi([([], None)])
    try:
        created = AtomicUpgradesProvider().create(_props(api.kubeconfig()))
        assert created.outs == {"namespace": "kube-system", "release": CILIUM, "release_sha256": "values-1",
                                "atomic": False}
        assert api.requests == [] and "kubeconfig" not in created.outs
    finally:
        api.close()


def test_an_unchanged_release_is_not_asked_again():
    provider = AtomicUpgradesProvider()
    olds = provider.create(_props("unused")).outs
    assert provider.diff("kube-system/cilium", olds, _props("unused")).changes is False


def test_the_first_upgrade_of_a_deployed_release_is_atomic_and_stays_so():
    api = StandInApi([([], None)])
    api.secrets = [helm_release_secret(CILIUM, 1, "deployed"), helm_release_secret("talos-ccm", 1, "deployed")]
    try:
        provider = AtomicUpgradesProvider()
        olds = provider.create(_props(api.kubeconfig())).outs
        upgrade = _props(api.kubeconfig(), "values-2")
        assert provider.diff("kube-system/cilium", olds, upgrade).changes is True
        outs = provider.update("kube-system/cilium", olds, upgrade).outs
        assert outs["atomic"] is True
        assert api.requests == [(f"{SECRETS_PATH}?{SELECTOR}", "system:masters")]
        # atomic from now on: later upgrades ask nothing
        assert provider.diff("kube-system/cilium", outs, _props(api.kubeconfig(), "values-3")).changes is False
    finally:
        api.close()


def test_a_release_whose_first_install_failed_is_upgraded_without_atomic_again():
    api = StandInApi([([], None)])
    api.secrets = [helm_release_secret(CILIUM, 1, "failed")]
    try:
        provider = AtomicUpgradesProvider()
        olds = provider.create(_props(api.kubeconfig())).outs
        outs = provider.update("kube-system/cilium", olds, _props(api.kubeconfig(), "values-2")).outs
        assert outs["atomic"] is False
        assert provider.diff("kube-system/cilium", outs, _props(api.kubeconfig(), "values-3")).changes is True
    finally:
        api.close()


def test_an_unreachable_api_means_not_atomic_with_a_line_saying_why(capfd):
    api = StandInApi([([], None)])
    kubeconfig = api.kubeconfig()
    api.close()
    provider = AtomicUpgradesProvider()
    olds = provider.create(_props(kubeconfig)).outs
    assert provider.update("kube-system/cilium", olds, _props(kubeconfig, "values-2")).outs["atomic"] is False
    err = capfd.readouterr().err
    assert err.startswith("talos-proxmox: release cilium: cannot tell whether it is deployed (")
    assert err.rstrip().endswith("upgrading it without atomic") and "PRIVATE KEY" not in err
