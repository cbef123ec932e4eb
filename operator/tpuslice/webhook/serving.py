"""The identity webhook in the shell: its certificates, its server and its configuration,
kept current on a thread of their own. The policy webhook rides along: the same
server (its own path, answered from a ``PolicyCache``), the same certificate, and
its ValidatingWebhookConfiguration applied with the mutating one.

Started by ``tpuslice webhook`` (``main/webhook_process.py``), a process of its own
that the chart runs as a Deployment of its own, or inside ``tpuslice run`` before
leader election is tried (one process next to a local API server): the same code
either way. Every replica serves, so the Service spreads admission calls over all
of them. Where the certificates come from:

- ``--webhook-secret``: the Secret every replica shares (``webhookcerts.py``
  decides; this module reads and writes it). The chart's default.
- cert-manager: ``tls.crt``, ``tls.key`` and ``ca.crt`` mounted in the cert dir.
  cert-manager renews them in place; the files are read again every check, so
  the renewed certificate is served without a restart.
- neither: a CA made at start in the cert dir. Right for one instance (``tpuslice
  run`` next to a local API server, ``make demo``); two such instances behind one
  configuration would not trust each other's CA, which is why the chart uses the
  Secret.

Every check (``webhook_cert_check_seconds``) re-reads the source, serves a
changed certificate from the next connection on, and applies the configuration
again when its CA changed. Every replica applies the same configuration with
the same CA, so whichever applied last, the ``caBundle`` trusts all of them.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from tpuslice.runtime.config import OperatorConfig
from tpuslice.runtime.health import Health
from tpuslice.runtime.kube import ApiError, Kube
from tpuslice.runtime.policy_cache import PolicyCache
from tpuslice.webhook import certificates as webhookcerts
from tpuslice.webhook import configuration as webhook_config
from tpuslice.webhook import server as webhook_server
from tpuslice.webhook.certificates import CertBundle, CertFiles
from tpuslice.webhook.pinning import PinLookup
from tpuslice.webhook.policy_admission import policy_admission_response
from tpuslice.webhook.server import IdentityWebhookServer

__all__ = [
    "FilesInDir",
    "IdentityWebhook",
    "ReadCaches",
    "SharedSecret",
    "start_identity_webhook",
]

log = logging.getLogger(__name__)

#: After a failed check (the API server unreachable), try again this soon.
RETRY_SECONDS = 5.0
#: Of replicas racing to fill an empty Secret one wins per round; read again this often.
WRITE_ROUNDS = 3


class CertSource(Protocol):
    def current(self) -> CertFiles:
        """The files to serve now (reading, and if need be writing, the source)."""
        ...


@dataclass(frozen=True)
class FilesInDir:
    """Certificates in a directory: cert-manager's mounted files, or made at start."""

    files: CertFiles

    def current(self) -> CertFiles:
        return self.files


@dataclass
class SharedSecret:
    """The CA and serving certificate in one Secret, shared by every replica."""

    kube: Kube
    namespace: str
    name: str
    hosts: Sequence[str]
    directory: Path
    now: Callable[[], datetime.datetime] = field(
        default=lambda: datetime.datetime.now(datetime.UTC)
    )

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def current(self) -> CertFiles:
        for _ in range(WRITE_ROUNDS):
            try:
                secret = self.kube.get_secret(self.namespace, self.name)
            except ApiError as exc:
                if exc.not_found:
                    raise RuntimeError(
                        f"the Secret {self.ref} (--webhook-secret) does not exist: the chart "
                        f"renders it empty; elsewhere create it empty with `kubectl create "
                        f"secret generic {self.name} -n {self.namespace}`"
                    ) from exc
                raise
            plan = webhookcerts.plan(webhookcerts.stored_bundle(secret), self.hosts, self.now())
            if plan.action is not webhookcerts.Action.USE:
                try:
                    self.kube.update_secret(webhookcerts.secret_with(secret, plan.bundle))
                except ApiError as exc:
                    if not exc.conflict:
                        raise
                    log.info("another replica wrote the Secret %s first; reading it", self.ref)
                    continue
                what = "a new CA" if plan.action is webhookcerts.Action.NEW_CA else "a new"
                log.info(
                    "wrote %s serving certificate to the Secret %s: %s",
                    what,
                    self.ref,
                    plan.reason,
                )
            return self._files(plan.bundle)
        raise RuntimeError(
            f"the Secret {self.ref} changed under every one of {WRITE_ROUNDS} writes"
        )

    def _files(self, bundle: CertBundle) -> CertFiles:
        files = CertFiles(
            ca=self.directory / "ca.crt",
            cert=self.directory / "tls.crt",
            key=self.directory / "tls.key",
        )
        try:
            if files.contents() == (bundle.ca_pem, bundle.cert_pem, bundle.key_pem):
                return files
        except OSError:
            pass
        return webhookcerts.write_certificates(bundle, self.directory)


@dataclass(frozen=True)
class ReadCaches:
    """The read-only caches of cluster objects the webhooks answer from, owned by the
    process that serves them: never the operator's watches, which feed the pass and
    follow nothing in a standby: the policy webhook's ``PolicyCache``, and with
    ``--pin-at-admission`` the identity webhook's ``PinLookup`` (a slice's marked,
    held unit)."""

    policies: PolicyCache
    pins: PinLookup | None = None
    #: stops the watch that feeds ``pins``
    pins_stop: threading.Event | None = None

    @classmethod
    def of(cls, kube: Kube, *, pin_at_admission: bool = False) -> ReadCaches:
        """The caches over ``kube``; with ``pin_at_admission`` the pin lookup's watch of
        the SliceReservations starts here (pods stay gated until it has listed them)."""
        pins, stop = None, None
        if pin_at_admission:
            pins = PinLookup(kube.get_reservation_sync)
            stop = pins.follow(kube)
        return cls(
            policies=PolicyCache(kube.list_policies, kube.get_namespace),
            pins=pins,
            pins_stop=stop,
        )

    def stop(self) -> None:
        if self.pins_stop is not None:
            self.pins_stop.set()


class IdentityWebhook:
    """The running webhook: its server, where its certificates come from, and (unless
    cert-manager's CA injector owns it) how to apply its configuration."""

    def __init__(
        self,
        server: IdentityWebhookServer,
        source: CertSource,
        apply: Callable[[bytes], None] | None,
        *,
        serving: CertFiles,
        check_seconds: float,
    ) -> None:
        self.server = server
        self.source = source
        self._apply = apply
        self._check_seconds = check_seconds
        self._served = serving.contents()
        self._applied_ca: bytes | None = None
        self._stop = threading.Event()

    def refresh(self) -> None:
        """Serve the source's current certificate; apply the configuration if its CA
        is not the one last applied."""
        files = self.source.current()
        contents = files.contents()
        if contents != self._served:
            self.server.reload(files)
            self._served = contents
            log.info("identity webhook: serving a renewed certificate")
        if self._apply is not None and contents[0] != self._applied_ca:
            self._apply(contents[0])
            self._applied_ca = contents[0]

    def keep(self) -> None:
        """``refresh`` every check interval on a daemon thread (sooner after a failure)."""

        def loop() -> None:
            wait = self._check_seconds
            while not self._stop.wait(wait):
                try:
                    self.refresh()
                    wait = self._check_seconds
                except Exception as exc:
                    log.warning("identity webhook: checking the certificates failed: %s", exc)
                    wait = min(RETRY_SECONDS, self._check_seconds)

        threading.Thread(target=loop, name="webhook-certs", daemon=True).start()

    def drain(self) -> None:
        self.server.drain()

    def stop(self) -> None:
        self._stop.set()
        self.server.stop()


def start_identity_webhook(
    config: OperatorConfig, kube: Kube, health: Health, caches: ReadCaches | None = None
) -> IdentityWebhook:
    """Serve the webhook, apply its configuration, keep both current; tell ``health``.
    ``caches``: what the webhooks answer from (default: made here, over ``kube``)."""
    assert config.webhook_port is not None
    service = None
    if config.webhook_service:
        service = webhook_config.ServiceRef(
            config.webhook_service, config.webhook_namespace or "default"
        )
        hosts = webhookcerts.service_hosts(service.name, service.namespace)
    else:
        hosts = [urlparse(config.webhook_url or "https://127.0.0.1").hostname or "127.0.0.1"]
    directory = Path(config.webhook_cert_dir)
    source: CertSource
    if config.webhook_secret:
        source = SharedSecret(
            kube, config.webhook_namespace or "default", config.webhook_secret, hosts, directory
        )
    else:
        source = FilesInDir(webhookcerts.certificates_for(directory, hosts))
    files = source.current()
    caches = caches or ReadCaches.of(kube, pin_at_admission=config.pin_at_admission)
    policies = caches.policies
    server = webhook_server.serve_identity_webhook(
        files,
        port=config.webhook_port,
        addr=config.webhook_addr,
        metrics=kube.metrics,
        policy_answer=lambda review: policy_admission_response(review, policies.view),
        pin=caches.pins.pool_for if caches.pins is not None else None,
    )
    apply = None
    if config.manage_webhook_configuration and (service or config.webhook_url):
        where = config.webhook_url or f"service {service}"

        def apply(ca_bundle: bytes) -> None:
            kube.apply_webhook_configuration(
                webhook_config.webhook_configuration(
                    ca_bundle=ca_bundle,
                    url=config.webhook_url,
                    service=service,
                    timeout_seconds=config.webhook_timeout_seconds,
                    failure_policy=config.webhook_failure_policy,
                    namespace_selector=config.webhook_namespace_selector,
                )
            )
            log.info("TPU identity webhook configuration applied (%s)", where)
            kube.apply_validating_webhook_configuration(
                webhook_config.policy_webhook_configuration(
                    ca_bundle=ca_bundle,
                    url=config.webhook_url,
                    service=service,
                    timeout_seconds=config.webhook_timeout_seconds,
                )
            )
            log.info("TPUSlicePolicy webhook configuration applied (%s)", where)

    hook = IdentityWebhook(
        server, source, apply, serving=files, check_seconds=config.webhook_cert_check_seconds
    )
    try:
        hook.refresh()
    except Exception as exc:  # the API server may be back in a few seconds
        log.warning("applying the webhook configuration failed (%s); retrying", exc)
    health.webhook_listening()
    hook.keep()
    return hook
