"""A key per training job: a project, a runner key scoped to it, and what it may not do."""

from __future__ import annotations

import uuid

import pytest

import warren

from .conftest import Server


def test_a_job_key_works_in_its_project_only(server: Server, client: warren.Client) -> None:
    job = f"root/job-{uuid.uuid4().hex[:8]}"
    assert client.create_project(job) == job
    key = client.create_key("job", project=job, role="runner", expires_in=3600)
    assert key.secret is not None and key.secret.startswith("wrn_")
    assert (key.project, key.role) == (job, "runner")
    with warren.Client(server.url, key.secret) as jc:
        who = jc.whoami()
        assert who["project"] == job
        sb = jc.containers.create(image="host")
        try:
            assert sb.info().project == job
            assert sb.exec("echo hi").stdout == "hi\n"
            # Outside its project: refused, and others' sandboxes are not there for it.
            with pytest.raises(warren.PermissionDenied):
                jc.containers.create(image="host", project="root")
            other = client.containers.create(image="host")
            try:
                with pytest.raises(warren.NotFound):
                    jc.sandboxes.get(other.id)
                assert [s.id for s in jc.sandboxes.list()] == [sb.id]
            finally:
                other.kill()
            # A runner makes no keys.
            with pytest.raises(warren.PermissionDenied):
                jc.create_key("more", project=job)
        finally:
            sb.kill()
    client.revoke_key(key.id)
    with warren.Client(server.url, key.secret) as jc:
        with pytest.raises(warren.Unauthenticated):
            jc.whoami()
