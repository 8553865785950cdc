"""The production path: queued resources whose startup script fetches the code from a bucket
and runs the command on every worker, with no SSH; ``watch`` tells the job's truth.

record   the typed job record (``job.json``)
cloud    its queued resources and its record in the bucket, through ``multihost.cloud``
startup  the startup script's values, rendered (the script: multihost/remote/job_startup.sh)
submit   pack, upload once per code hash, record, create the queued resource
watch    poll the resource and the bucket; restart after preemption; fail fast; who watches
"""
