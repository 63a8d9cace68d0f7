"""The Kubernetes deployment of deploy/, validated as far as a machine without a cluster allows:
`dagster definitions validate` on the k8s executor; the Job dagster-k8s would create for a model
step holds one GPU; deploy/dagster.yaml passes Dagster's instance schema and opens for real, its
K8s run launcher on a kubeconfig (no API call is made) and its storage on the session's PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from ragutil_dagster.assets.common import GPU_POOL
from ragutil_dagster.definitions import build_definitions
from ragutil_dagster.errors import ConfigError
from ragutil_dagster.infra.databases import DAGSTER_HOME_VARIABLE, DAGSTER_POSTGRES_URL_VARIABLE
from ragutil_dagster.infra.executor_names import EXECUTOR_VARIABLE
from ragutil_dagster.resources.storage import SCRATCH_DIR_VARIABLE

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_definitions_validate_on_the_k8s_executor(tiny_world, make_tiny_config, tmp_path) -> None:
    _, world, models = tiny_world
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(make_tiny_config(models, world)))
    env = {key: value for key, value in os.environ.items() if key != DAGSTER_HOME_VARIABLE}
    env.update(
        {
            EXECUTOR_VARIABLE: "k8s",
            "RAGUTIL_CONFIG": str(config),
            "RAGUTIL_HOME": str(tmp_path / "home"),
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
    )
    command = [
        sys.executable,
        "-m",
        "dagster",
        "definitions",
        "validate",
        "-m",
        "ragutil_dagster.definitions",
        "-a",
        "defs",
    ]
    validated = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert validated.returncode == 0, validated.stderr[-3000:]
    assert "All code locations passed validation" in validated.stdout + validated.stderr


def test_a_model_step_is_a_kubernetes_job_with_one_gpu(tiny_experiment, tmp_path) -> None:
    from dagster_k8s import k8s_job_executor
    from dagster_k8s.job import (
        DagsterK8sJobConfig,
        construct_dagster_k8s_job,
        get_user_defined_k8s_config,
    )

    defs = build_definitions(tiny_experiment, str(tmp_path), executor_name="k8s")
    assert defs.executor is k8s_job_executor
    ops = {a.op.name: a.op for a in defs.assets if isinstance(a, dg.AssetsDefinition)}
    model_ops = {name for name, op in ops.items() if op.pool == GPU_POOL}
    assert model_ops == {
        "passage_embeddings",
        "index",
        "retrieval",
        "closed_book_generations",
        "generations",
        "entailment_clusters",
        "utility_judgments",
        "utility_transfer",
    }
    for name, op in ops.items():
        job = construct_dagster_k8s_job(
            DagsterK8sJobConfig(
                job_image="REGISTRY/ragutil:TAG", dagster_home="/opt/dagster/dagster_home"
            ),
            args=["dagster", "api", "execute_step"],
            job_name=f"ragutil-step-{name.replace('_', '-')}",
            user_defined_k8s_config=get_user_defined_k8s_config(op.tags),
        ).to_dict()
        pod = job["spec"]["template"]["spec"]
        limits = (pod["containers"][0]["resources"] or {}).get("limits") or {}
        tolerations = [t["key"] for t in pod.get("tolerations") or []]
        if name in model_ops:
            assert limits == {"nvidia.com/gpu": "1"} and tolerations == ["nvidia.com/gpu"], name
        else:
            assert "nvidia.com/gpu" not in limits and not tolerations, name

    with pytest.raises(
        ConfigError, match="RAGUTIL_EXECUTOR='dask': unknown executor; choose one of k8s, celery"
    ):
        build_definitions(tiny_experiment, str(tmp_path), executor_name="dask")


def test_the_deployment_instance_opens_with_the_k8s_launcher_on_postgres(
    postgres, tmp_path, monkeypatch
) -> None:
    from dagster._config import process_config, resolve_to_config_type
    from dagster._core.instance.config import dagster_instance_config
    from dagster_k8s import K8sRunLauncher

    monkeypatch.setenv(
        DAGSTER_POSTGRES_URL_VARIABLE,
        postgres.create_database("k8s_instance").replace("postgresql://", "postgresql+psycopg2://"),
    )
    settings, _ = dagster_instance_config(str(DEPLOY))
    launcher = settings["run_launcher"]
    checked = process_config(
        resolve_to_config_type(K8sRunLauncher.config_type()), launcher["config"]
    )
    assert checked.success, checked.errors
    assert (
        checked.value["env_secrets"] == ["ragutil-env"] and checked.value["load_incluster_config"]
    )
    # Every pod mounts the ReadWriteMany claim of scratch-pvc.yaml where $RAGUTIL_SCRATCH_DIR points.
    claim = yaml.safe_load((DEPLOY / "scratch-pvc.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    (volume,) = checked.value["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert checked.value["volume_mounts"] == [
        {"name": volume["name"], "mountPath": "/mnt/ragutil-scratch"}
    ]
    assert f"{SCRATCH_DIR_VARIABLE}=/mnt/ragutil-scratch" in checked.value["env_vars"]

    # The same file, but the launcher reads a kubeconfig (parsed, never contacted) instead of
    # the in-cluster service account this machine does not have.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "test",
                "clusters": [{"name": "test", "cluster": {"server": "https://127.0.0.1:9"}}],
                "contexts": [
                    {
                        "name": "test",
                        "context": {"cluster": "test", "user": "test", "namespace": "ragutil"},
                    }
                ],
                "users": [{"name": "test", "user": {"token": "unused"}}],
            }
        )
    )
    local = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    local["run_launcher"]["config"].update(
        load_incluster_config=False, kubeconfig_file=str(kubeconfig)
    )
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(local))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.run_launcher, K8sRunLauncher)
        assert instance.run_launcher.job_namespace == "ragutil"
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert instance.get_runs() == []
        assert instance.event_log_storage.get_concurrency_info(GPU_POOL).limit == 8
    assert postgres.query("k8s_instance", "SELECT count(*) FROM runs") == [(0,)]
