"""The executors a ragutil run can use besides this machine's processes, by name: the one list the
Definitions (``$RAGUTIL_EXECUTOR``) and ``ragutil run --executor`` read. Kept free of imports, so
the command line does not load Dagster to build its parser."""

EXECUTOR_VARIABLE = "RAGUTIL_EXECUTOR"
K8S_EXECUTOR = "k8s"
"""dagster-k8s's ``k8s_job_executor``, one Kubernetes Job per step (deploy/; the ``[k8s]`` extra)."""
CELERY_EXECUTOR = "celery"
"""dagster-celery's executor, every step a task for Celery workers that share only the databases,
the artifact store and the vLLM servers (``celery_executor.py``; the ``[celery]`` extra);
``ragutil run --executor celery`` drives it too."""
EXECUTORS = (K8S_EXECUTOR, CELERY_EXECUTOR)
