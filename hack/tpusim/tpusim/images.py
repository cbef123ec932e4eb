"""The real-node tier's container images, built on this machine with no daemon and no registry.

A real kubelet node (containerd) needs real images: the operator image from the
project's unchanged Dockerfile, and a Ray image for a real Ray head pod. Neither
Docker nor a registry is available here, so:

1. **Base.** The Dockerfile's ``FROM ${PYTHON_IMAGE}`` (the official slim Python
   image on GKE) cannot be pulled. A stand-in is made with ``debootstrap`` (Debian
   bookworm's Python 3.11, a venv at /opt/python so ``pip`` behaves as in the
   official image) and committed into buildah's storage under the exact FROM name,
   so the build never tries to pull. It is built once per recipe hash. The build
   sets ``PYTHON_IMAGE_DIGEST`` empty: a stand-in has no digest of the official image.
2. **Operator.** ``buildah bud`` of the Dockerfile from the repo root, tagged
   with the pyproject version and a content tag (hash of what .dockerignore
   admits, the Dockerfile and the base recipe), exported to a docker-archive tar
   that ``ctr images import`` takes. Nothing is rebuilt while the content tag's
   tar (or image) exists. Without ``--layers``: buildah 1.28 would reuse a stale
   ``RUN --mount=...,from=build`` layer (see :func:`layer_cache_safe`).
3. **Ray** (optional). hack/tpusim/images/ray.Dockerfile: ``ray[default]`` on the
   same base with ``--layers``, rebuilt only when its recipe changes (pip fetching
   Ray is slow).

Everything lives under ``<cache_dir>/images`` (the tools cache by default):
buildah's storage (``--root``/``--runroot``; :func:`clean_images` or ``python -m
tpusim images --clean`` removes it), the rootfs tarball, the exported tars and
one log file per step. Each failure raises :class:`ImageBuildError` naming the
step and its log. Needs root (debootstrap, chroot, buildah's rootful storage).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from .processes import log_excerpt

__all__ = [
    "BaseRecipe",
    "Buildah",
    "ImageArchive",
    "ImageBuildError",
    "Images",
    "build_images",
    "check_images",
    "clean_images",
    "context_files",
    "parse_dockerignore",
    "run_in_image",
]

log = logging.getLogger(__name__)

#: Bump when a step below changes what ends up in the base without changing the
#: recipe fields (the trim list, the tar flags): old caches then stop matching.
BASE_RECIPE_VERSION = 1
DEBIAN_SUITE = "bookworm"
#: python3-venv: the venv that gives the image a ``pip`` (as the official image
#: has) without Debian's PEP 668 refusal. ca-certificates: pip over HTTPS. wget:
#: KubeRay's generated head and worker probes exec ``wget ... | grep success``,
#: so the Ray image (built on this base) needs it; the official slim image has none.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "wget")
VENV = "/opt/python"
BASE_ENV = (
    ("PATH", f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("LANG", "C.UTF-8"),
)
BASE_CMD = ("python3",)
#: Removed from the rootfs before it is packed: caches that only apt needs, logs,
#: and files a container runtime provides at run time.
BASE_TRIM = (
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/log",
    "etc/resolv.conf",
    "etc/hostname",
)
#: Image label holding the base's recipe hash: how a later run tells its base is
#: current. Images built on the base inherit it, which marks them as built on the
#: stand-in rather than the official image.
RECIPE_LABEL = "dev.tpusim.base-recipe"
#: Where Debian's update-ca-certificates takes local CAs from (host and rootfs alike).
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
OPERATOR_REPO = "localhost/tpuslice-operator"
RAY_REPO = "localhost/tpusim-ray"
RAY_DOCKERFILE = Path("hack/tpusim/images/ray.Dockerfile")
#: Bump when the way the operator or Ray image is built changes (argv, format).
IMAGE_RECIPE_VERSION = 1
#: Paths outside ``--root``/``--runroot`` that buildah writes anyway (seen with
#: buildah 1.28 in a mount namespace with these paths on tmpfs): containers/image's
#: blob-info cache (a boltdb, written by commit and push; buildah has no flag to
#: move it), and runc's default state root /run/runc (RUN steps and ``buildah
#: run``; empty afterwards). ``--network host`` keeps netavark from writing
#: /run/containers/networks and /etc/containers/networks; /run/containers is
#: listed for a run without it.
HOST_WRITES = (
    Path("/var/lib/containers/cache"),
    Path("/var/lib/containers"),
    Path("/run/containers"),
    Path("/run/runc"),
)
HOST_WRITE_FILES = (Path("/var/lib/containers/cache/blob-info-cache-v1.boltdb"),)


class ImageBuildError(RuntimeError):
    """A build step failed; names the step, its log file and the log's last lines."""

    def __init__(self, step: str, log_file: Path | None, reason: str) -> None:
        super().__init__(f"image step {step!r} failed: {reason}{log_excerpt(log_file, 20)}")
        self.step = step
        self.log_file = log_file


# ---------------------------------------------------------------- pure parts


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_key(obj: object) -> str:
    """A stable hash of a JSON-able recipe (sorted keys, no whitespace)."""
    return _sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode())


def qualify_ref(ref: str) -> str:
    """Docker's normalisation of a short name: ``python:3`` is ``docker.io/library/python:3``.

    buildah resolves a FROM line's short name to this form when it looks in local
    storage, so the base must be committed under it.
    """
    first, _, rest = ref.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        ref = f"docker.io/{ref}"
    registry, _, path = ref.partition("/")
    if registry == "docker.io" and "/" not in path:
        ref = f"docker.io/library/{path}"
    return ref


def dockerfile_arg(text: str, name: str) -> str:
    """The default of ``ARG name=value`` in a Dockerfile (the first one)."""
    match = re.search(rf"^ARG {re.escape(name)}=(\S+)\s*$", text, flags=re.MULTILINE)
    if match is None:
        raise ValueError(f"no `ARG {name}=...` in the Dockerfile")
    return match.group(1)


def debian_mirror(sources: Sequence[str]) -> str | None:
    """The first Debian archive URI in apt source files (one-line or deb822 format).

    Only a URI serving the main archive counts (its path ends in ``/debian``), not
    the security archive or third-party repositories.
    """
    uris: list[str] = []
    for text in sources:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("URIs:"):
                uris += line.split()[1:]
            elif line.startswith("deb "):
                words = [w for w in line.split()[1:] if not w.startswith("[")]
                uris += words[:1]
    for uri in uris:
        if re.fullmatch(r"https?://\S+/debian/?", uri):
            return uri.rstrip("/")
    return None


@dataclass(frozen=True)
class BaseRecipe:
    """Everything that decides the base image's content; its hash is the cache key.

    The Debian mirror is left out on purpose: any mirror of the same suite gives
    the same image, so switching mirrors does not throw the cache away.
    """

    ref: str
    suite: str = DEBIAN_SUITE
    packages: tuple[str, ...] = BASE_PACKAGES
    env: tuple[tuple[str, str], ...] = BASE_ENV
    cmd: tuple[str, ...] = BASE_CMD
    venv: str = VENV
    trim: tuple[str, ...] = BASE_TRIM
    #: (path relative to the CA directory, sha256) of the host's extra CAs.
    extra_cas: tuple[tuple[str, str], ...] = ()

    def key(self) -> str:
        return _json_key(
            {
                "version": BASE_RECIPE_VERSION,
                "ref": self.ref,
                "suite": self.suite,
                "packages": sorted(self.packages),
                "env": list(self.env),
                "cmd": list(self.cmd),
                "venv": self.venv,
                "trim": list(self.trim),
                "extra_cas": sorted(self.extra_cas),
            }
        )


def host_extra_cas(ca_dir: Path = HOST_CA_DIR) -> tuple[tuple[str, str], ...]:
    """The host's locally added CA certificates (``*.crt``, as update-ca-certificates reads).

    On a machine behind an intercepting HTTPS proxy this holds the proxy's CA, which
    pip inside the build needs; elsewhere (a CI runner) it is usually empty and the
    base gets no extra CA.
    """
    if not ca_dir.is_dir():
        return ()
    return tuple(
        (str(p.relative_to(ca_dir)), _sha256(p.read_bytes()))
        for p in sorted(ca_dir.rglob("*.crt"))
        if p.is_file()
    )


def debootstrap_argv(recipe: BaseRecipe, rootfs: Path, mirror: str) -> list[str]:
    return [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(recipe.packages)}",
        recipe.suite,
        str(rootfs),
        mirror,
    ]


@dataclass(frozen=True)
class _Rule:
    negate: bool
    parts: tuple[str, ...]


def parse_dockerignore(text: str) -> tuple[_Rule, ...]:
    """.dockerignore lines as rules (order kept: the last matching rule wins)."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        parts = tuple(p for p in pattern.split("/") if p not in ("", "."))
        if parts:
            rules.append(_Rule(negate, parts))
    return tuple(rules)


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whole-path match; ``**`` spans any number of segments, ``*`` stays within one."""
    if not pattern:
        return not path
    if pattern[0] == "**":
        return any(_match(pattern[1:], path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatchcase(path[0], pattern[0]) and _match(pattern[1:], path[1:])


def _rule_hits(rule: _Rule, path: tuple[str, ...]) -> bool:
    # Docker: a rule matching a directory matches everything beneath it.
    return any(_match(rule.parts, path[:n]) for n in range(1, len(path) + 1))


def _may_reinclude_below(rule: _Rule, directory: tuple[str, ...]) -> bool:
    """Could this ``!`` rule match something inside ``directory``?"""
    for i, segment in enumerate(directory):
        if i >= len(rule.parts) or rule.parts[i] == "**":
            return True
        if not fnmatchcase(segment, rule.parts[i]):
            return False
    return True


def is_ignored(rules: Sequence[_Rule], path: tuple[str, ...]) -> bool:
    ignored = False
    for rule in rules:
        if _rule_hits(rule, path):
            ignored = not rule.negate
    return ignored


def context_files(root: Path, rules: Sequence[_Rule]) -> list[str]:
    """Files of a build context that .dockerignore admits, as sorted POSIX paths.

    A mirror of Docker's rules for the patterns this project uses (``*``, ``**``,
    ``!`` exceptions, directory patterns); excluded directories that no exception
    can reach are not walked, so .git and .venv cost nothing.
    """
    found: list[str] = []
    negations = [r for r in rules if r.negate]
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).parts
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not is_ignored(rules, (*rel, d))
            or any(_may_reinclude_below(r, (*rel, d)) for r in negations)
        )
        found += ["/".join((*rel, f)) for f in filenames if not is_ignored(rules, (*rel, f))]
    return sorted(found)


def context_digest(root: Path, files: Sequence[str]) -> str:
    """Hash of the context's paths, executable bits and contents (symlinks by target)."""
    entries: list[list[object]] = []
    for name in files:
        path = root / name
        if path.is_symlink():
            entries.append([name, "link", os.readlink(path)])
        else:
            executable = bool(path.stat().st_mode & 0o111)
            entries.append([name, executable, _sha256(path.read_bytes())])
    return _json_key(entries)


def operator_key(base_key: str, dockerfile: bytes, dockerignore: bytes, context: str) -> str:
    return _json_key(
        {
            "version": IMAGE_RECIPE_VERSION,
            "base": base_key,
            "dockerfile": _sha256(dockerfile),
            "dockerignore": _sha256(dockerignore),
            "context": context,
        }
    )


def ray_key(base_key: str, dockerfile: bytes, ray_version: str) -> str:
    return _json_key(
        {
            "version": IMAGE_RECIPE_VERSION,
            "base": base_key,
            "dockerfile": _sha256(dockerfile),
            "ray": ray_version,
        }
    )


@dataclass(frozen=True)
class Buildah:
    """buildah command lines against one private storage (``--root``/``--runroot``)."""

    root: Path
    runroot: Path
    exe: str = "buildah"

    def argv(self, *args: str) -> list[str]:
        return [
            self.exe,
            "--root",
            str(self.root),
            "--runroot",
            str(self.runroot),
            "--storage-driver",
            "overlay",
            *args,
        ]

    def bud(
        self,
        *,
        dockerfile: Path,
        context: Path,
        tags: Sequence[str],
        iidfile: Path,
        layers: bool,
        build_args: Mapping[str, str] | None = None,
    ) -> list[str]:
        """``bud`` as the tier needs it.

        ``--layers`` only when :func:`layer_cache_safe` says so (given explicitly
        either way, so a BUILDAH_LAYERS in the environment cannot flip it).
        ``--pull=never``: the base exists only locally, a pull attempt would only
        fail late. ``--network host``: RUN steps share the host's network, so
        netavark sets up nothing (it leaves NETAVARK chains in the nft nat table).
        ``--format docker``: the docker-archive export then needs no conversion.
        """
        args = [
            "bud",
            f"--layers={str(layers).lower()}",
            "--network",
            "host",
            "--pull=never",
            "--format",
            "docker",
            "--iidfile",
            str(iidfile),
            "-f",
            str(dockerfile),
        ]
        for name, value in sorted((build_args or {}).items()):
            args += ["--build-arg", f"{name}={value}"]
        for tag in tags:
            args += ["-t", tag]
        return self.argv(*args, str(context))

    def push_archive(self, image: str, tar: Path, name: str) -> list[str]:
        """Export ``image`` to a docker-archive tar whose manifest names it ``name``."""
        return self.argv("push", image, f"docker-archive:{tar}:{name}")


def layer_cache_safe(dockerfile: str) -> bool:
    """Whether buildah 1.28's layer cache can be trusted for this Dockerfile.

    It cannot when a RUN bind-mounts another stage (``RUN --mount=...,from=...``):
    buildah reuses the cached RUN layer although the mounted stage was rebuilt
    (seen here: the operator image kept the old wheels after a source change;
    upstream containers/buildah#4522 and #6609, fixed only in 2026 by #6845). The
    project's Dockerfile installs its wheels that way, so its builds go without
    ``--layers``; an unchanged context is not rebuilt at all (its tar or its
    content tag is reused), which is what the layer cache would have saved.
    """
    joined = dockerfile.replace("\\\n", " ")  # continuation lines into one
    return not re.search(r"^\s*RUN\s[^\n]*--mount=[^\s]*\bfrom=", joined, flags=re.MULTILINE)


def image_label(inspect_output: str, label: str) -> str | None:
    """A label of ``buildah inspect --type image`` JSON output (None when absent)."""
    data: dict[str, Any] = json.loads(inspect_output)
    for config in (data.get("OCIv1", {}).get("config", {}), data.get("Docker", {}).get("config")):
        labels = (config or {}).get("Labels") or {}
        if label in labels:
            return str(labels[label])
    return None


def installed_ray_version() -> str | None:
    """Ray's version in this interpreter (the project's .venv), if installed."""
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class ImageArchive:
    """One image exported for ``ctr -n k8s.io images import``.

    ``ref`` is the name recorded in the tar (what containerd will call it),
    ``tags`` every name it has in buildah's storage, ``key`` its recipe hash.
    """

    ref: str
    tar: Path
    tags: tuple[str, ...]
    key: str
    cached: bool


@dataclass(frozen=True)
class Images:
    """What :func:`build_images` made, and how long each step took (seconds)."""

    base_ref: str
    operator: ImageArchive
    ray: ImageArchive | None
    steps: dict[str, float] = field(default_factory=dict)

    @property
    def operator_tar(self) -> Path:
        return self.operator.tar

    @property
    def operator_ref(self) -> str:
        return self.operator.ref

    @property
    def ray_tar(self) -> Path | None:
        return self.ray.tar if self.ray else None

    @property
    def ray_ref(self) -> str | None:
        return self.ray.ref if self.ray else None


# ---------------------------------------------------------------- the builder


class _Builder:
    """Runs the steps for one :func:`build_images` call; one log file per step."""

    def __init__(self, repo_root: Path, cache_dir: Path, mirror: str | None) -> None:
        self.repo = repo_root.resolve()
        self.dir = cache_dir.resolve() / "images"
        self.logs = self.dir / "logs"
        self.tmp = self.dir / "tmp"
        self.buildah = Buildah(self.dir / "buildah" / "root", self.dir / "buildah" / "runroot")
        self.mirror = mirror
        self.steps: dict[str, float] = {}
        self._log_file: Path | None = None
        self._step = ""
        self._env = {
            **os.environ,
            # Large temporaries of buildah/containers-image (default /var/tmp).
            "TMPDIR": str(self.tmp),
        }

    # -- step plumbing

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[Path]:
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        self._log_file = self.logs / f"{slug}.log"
        self._log_file.write_text("")
        self._step = name
        began = time.monotonic()
        log.info("%s ...", name)
        try:
            yield self._log_file
        except ImageBuildError:
            raise
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise ImageBuildError(name, self._log_file, repr(exc)) from exc
        elapsed = time.monotonic() - began
        self.steps[name] = round(elapsed, 2)
        log.info("%s: %.1fs (log %s)", name, elapsed, self._log_file)

    def cached(self, name: str, what: str) -> None:
        self.steps[name] = 0.0
        log.info("%s: cached (%s)", name, what)

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, capture: bool = False
    ) -> str:
        """Run one command of the current step, its output appended to the step's log."""
        assert self._log_file is not None
        with self._log_file.open("ab") as fh:
            fh.write(f"$ {' '.join(argv)}\n".encode())
            fh.flush()
            done = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if capture else fh,
                stderr=fh,
                env=dict(env) if env is not None else self._env,
                check=False,
            )
        if done.returncode != 0:
            raise ImageBuildError(
                self._step, self._log_file, f"`{argv[0]} {argv[1]}` exited {done.returncode}"
            )
        return done.stdout.decode() if capture else ""

    def probe(self, argv: Sequence[str]) -> str | None:
        """Output of a query command, or None if it fails (e.g. no such image)."""
        done = subprocess.run(
            list(argv), capture_output=True, env=self._env, check=False, stdin=subprocess.DEVNULL
        )
        return done.stdout.decode() if done.returncode == 0 else None

    def image_key(self, ref: str) -> str | None:
        out = self.probe(self.buildah.argv("inspect", "--type", "image", ref))
        return image_label(out, RECIPE_LABEL) if out else None

    # -- preflight

    def preflight(self, need_base_tools: bool) -> None:
        with self.step("preflight"):
            if os.geteuid() != 0:
                raise ImageBuildError(
                    "preflight", None, "needs root (debootstrap, chroot, buildah)"
                )
            tools = ["buildah", "tar"] + (["debootstrap", "chroot"] if need_base_tools else [])
            missing = [t for t in tools if shutil.which(t) is None]
            if missing:
                raise ImageBuildError("preflight", None, f"missing on PATH: {', '.join(missing)}")

    # -- base

    def base_recipe(self) -> BaseRecipe:
        ref = qualify_ref(dockerfile_arg((self.repo / "Dockerfile").read_text(), "PYTHON_IMAGE"))
        return BaseRecipe(ref=ref, extra_cas=host_extra_cas())

    def ensure_base(self, recipe: BaseRecipe) -> str:
        key = recipe.key()
        if self.image_key(recipe.ref) == key:
            self.cached("base", f"{recipe.ref} with {RECIPE_LABEL}={key[:16]}")
            return key
        tarball = self.dir / "base" / f"rootfs-{key[:16]}.tar"
        if tarball.exists():
            self.cached("base: rootfs", str(tarball))
        else:
            self.make_rootfs(recipe, tarball)
        self.import_base(recipe, tarball)
        for old in tarball.parent.glob("rootfs-*.tar"):
            if old != tarball:
                old.unlink()
        return key

    def make_rootfs(self, recipe: BaseRecipe, tarball: Path) -> None:
        work = self.dir / "work" / tarball.stem
        _remove_tree(work)
        work.parent.mkdir(parents=True, exist_ok=True)
        mirror = self.mirror or _host_mirror() or DEFAULT_MIRROR
        # A clean environment for the chroot: the host's PIP_*/SSL_* settings name
        # host paths that do not exist inside.
        chroot_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
        try:
            with self.step("base: debootstrap"):
                self.run(debootstrap_argv(recipe, work, mirror))
            with self.step("base: venv"):
                self.run(
                    ["chroot", str(work), "python3", "-m", "venv", recipe.venv], env=chroot_env
                )
                self.run(
                    ["chroot", str(work), f"{recipe.venv}/bin/pip", "--version"], env=chroot_env
                )
            if recipe.extra_cas:
                with self.step("base: extra CA certificates"):
                    for name, _digest in recipe.extra_cas:
                        target = work / HOST_CA_DIR.relative_to("/") / name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(HOST_CA_DIR / name, target)
                    self.run(["chroot", str(work), "update-ca-certificates"], env=chroot_env)
            with self.step("base: rootfs tarball"):
                for rel in recipe.trim:
                    _empty(work / rel)
                tarball.parent.mkdir(parents=True, exist_ok=True)
                partial = tarball.with_suffix(".partial")
                # /dev is left out: the runtime mounts its own (debootstrap made nodes).
                self.run(
                    [
                        "tar",
                        "--numeric-owner",
                        "--xattrs",
                        "--one-file-system",
                        "--exclude=./dev/*",
                        "-C",
                        str(work),
                        "-cf",
                        str(partial),
                        ".",
                    ]
                )
                partial.rename(tarball)
                _remove_tree(work)  # inside the step: ~10 s on a busy disk
        finally:
            _remove_tree(work)
            with contextlib.suppress(OSError):
                work.parent.rmdir()

    def import_base(self, recipe: BaseRecipe, tarball: Path) -> None:
        key = recipe.key()
        name = f"tpusim-base-{key[:16]}"
        with self.step("base: import"):
            self.probe(self.buildah.argv("rm", name))  # a leftover of an interrupted run
            self.run(self.buildah.argv("from", "--name", name, "--pull=never", "scratch"))
            self.run(self.buildah.argv("add", name, str(tarball), "/"))
            config = ["config", "--cmd", json.dumps(list(recipe.cmd))]
            for env_name, value in recipe.env:
                config += ["--env", f"{env_name}={value}"]
            config += [
                "--label",
                f"{RECIPE_LABEL}={key}",
                "--label",
                "dev.tpusim.description=local stand-in for the Dockerfile's base, not the "
                "official image",
            ]
            self.run(self.buildah.argv(*config, name))
            self.run(self.buildah.argv("commit", "--rm", "--format", "docker", name, recipe.ref))

    # -- images from Dockerfiles

    def build_and_export(
        self,
        label: str,
        *,
        dockerfile: Path,
        context: Path,
        repo: str,
        version: str,
        tar_prefix: str,
        key: str,
        build_args: Mapping[str, str] | None = None,
    ) -> ImageArchive:
        """The image of ``key`` as ``<tar_prefix><key>.tar``, doing only what is missing.

        Tagged ``repo:version`` (the name in the tar) and ``repo:ctx-<key>``. A tar
        that exists is reused; an image that still carries the content tag is only
        exported again; otherwise it is built. Older tars and content tags go.
        """
        ref = f"{repo}:{version}"
        content_tag = f"{repo}:ctx-{key[:12]}"
        tags = (ref, content_tag)
        tar = self.dir / f"{tar_prefix}{key[:12]}.tar"
        if tar.exists():
            self.cached(f"{label}: build", str(tar))
            return ImageArchive(ref, tar, tags, key, cached=True)
        if self.probe(self.buildah.argv("inspect", "--type", "image", content_tag)) is not None:
            self.cached(f"{label}: build", f"{content_tag} in buildah's storage")
        else:
            with self.step(f"{label}: build"):
                self.run(
                    self.buildah.bud(
                        dockerfile=dockerfile,
                        context=context,
                        tags=tags,
                        iidfile=self.tmp / f"{label}.iid",
                        layers=layer_cache_safe(dockerfile.read_text()),
                        build_args=build_args,
                    )
                )
        with self.step(f"{label}: export"):
            partial = tar.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            self.run(self.buildah.push_archive(content_tag, partial, ref))
            partial.rename(tar)
            # Re-point the version tag: a build of another checkout may have moved it.
            self.run(self.buildah.argv("tag", content_tag, ref))
        for old in self.dir.glob(f"{tar_prefix}*.tar"):
            if old != tar:
                old.unlink()
        self.drop_old_content_tags(repo, keep=content_tag)
        return ImageArchive(ref, tar, tags, key, cached=False)

    def drop_old_content_tags(self, repo: str, keep: str) -> None:
        """Untag older ``ctx-`` builds and prune what nothing names (bounds the storage).

        ``rmi --prune`` removes dangling images only (no name, no child): older
        builds and their stage images, not the intermediate images a ``--layers``
        build (Ray) keeps as its cache, which have children.
        """
        out = self.probe(self.buildah.argv("images", "--format", "{{.Name}}:{{.Tag}}"))
        for name in (out or "").split():
            if name.startswith(f"{repo}:ctx-") and name != keep:
                self.probe(self.buildah.argv("rmi", name))
        self.probe(self.buildah.argv("rmi", "--prune"))


def _host_mirror() -> str | None:
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    return debian_mirror([p.read_text() for p in files if p.is_file()])


def _mounts_below(path: Path) -> list[str]:
    prefix = str(path.resolve())
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def _remove_tree(path: Path) -> None:
    """rmtree, refusing if anything is mounted below (a rootfs must never take /proc along)."""
    if not path.exists():
        return
    mounted = _mounts_below(path)
    if mounted:
        raise ImageBuildError("cleanup", None, f"mounts below {path}: {mounted}")
    shutil.rmtree(path)


def _empty(path: Path) -> None:
    """Remove a file, or a directory's contents (keeping the directory)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _existing(paths: Sequence[Path]) -> set[Path]:
    return {p for p in paths if p.exists()}


def _clean_host_writes(existed_before: set[Path]) -> list[Path]:
    """Remove what buildah wrote outside its ``--root``, if this run created it.

    Only the files named in :data:`HOST_WRITE_FILES` are deleted, then the
    directories of :data:`HOST_WRITES` that are left empty (deepest first): a
    directory that existed before the run, or that holds anything else (another
    podman/buildah user's storage), is left alone.
    """
    removed = []
    for path in HOST_WRITE_FILES:
        if path.parent not in existed_before and path.is_file():
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    for path in sorted(HOST_WRITES, key=lambda p: len(p.parts), reverse=True):
        if path not in existed_before and path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()  # only if empty
                removed.append(path)
    for path in removed:
        log.info("removed %s (written by buildah outside its --root)", path)
    return removed


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One build per cache directory at a time (tests and a CLI run may overlap)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def project_version(repo_root: Path) -> str:
    data = tomllib.loads((repo_root / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def build_images(
    repo_root: Path,
    cache_dir: Path,
    *,
    ray: bool = False,
    ray_version: str | None = None,
    mirror: str | None = None,
) -> Images:
    """Build (or reuse) the base, the operator image and, with ``ray``, the Ray image.

    ``cache_dir`` is normally the tools cache (``ToolPaths.for_repo(root).root``);
    everything goes to ``<cache_dir>/images``. A second call with nothing changed
    only hashes the build context and inspects one image (well under a second).
    ``ray_version`` defaults to the Ray installed in this interpreter, else the
    ray.Dockerfile's ``ARG RAY_VERSION``. Raises :class:`ImageBuildError`.
    """
    b = _Builder(repo_root, cache_dir, mirror)
    with _locked(b.dir):
        for d in (b.logs, b.tmp):
            d.mkdir(parents=True, exist_ok=True)
        before = _existing(HOST_WRITES)
        try:
            recipe = b.base_recipe()
            b.preflight(need_base_tools=b.image_key(recipe.ref) != recipe.key())
            base_key = b.ensure_base(recipe)

            dockerfile = b.repo / "Dockerfile"
            ignore = b.repo / ".dockerignore"
            ignore_bytes = ignore.read_bytes() if ignore.exists() else b""
            with b.step("operator: hash context"):
                files = context_files(b.repo, parse_dockerignore(ignore_bytes.decode()))
                key = operator_key(
                    base_key, dockerfile.read_bytes(), ignore_bytes, context_digest(b.repo, files)
                )
            version = project_version(b.repo)
            operator = b.build_and_export(
                "operator",
                dockerfile=dockerfile,
                context=b.repo,
                repo=OPERATOR_REPO,
                version=version,
                tar_prefix=f"tpuslice-operator-{version}-",
                key=key,
                build_args={"PYTHON_IMAGE_DIGEST": ""},
            )

            ray_image = None
            if ray:
                ray_file = b.repo / RAY_DOCKERFILE
                text = ray_file.read_bytes()
                version_ = (
                    ray_version
                    or installed_ray_version()
                    or dockerfile_arg(text.decode(), "RAY_VERSION")
                )
                rkey = ray_key(base_key, text, version_)
                ray_image = b.build_and_export(
                    "ray",
                    dockerfile=ray_file,
                    context=ray_file.parent,
                    repo=RAY_REPO,
                    version=version_,
                    tar_prefix=f"tpusim-ray-{version_}-",
                    key=rkey,
                    build_args={"RAY_VERSION": version_, "BASE_IMAGE": recipe.ref},
                )
        finally:
            _clean_host_writes(before)
            shutil.rmtree(b.tmp, ignore_errors=True)
    return Images(recipe.ref, operator, ray_image, dict(b.steps))


def run_in_image(cache_dir: Path, ref: str, argv: Sequence[str], timeout_s: float = 300) -> str:
    """Run ``argv`` in a throw-away container of ``ref`` (buildah run); its output.

    For smoke checks of an image before a real node imports it. Host network (no
    netavark), the image's own user and working directory; the container is
    removed afterwards. Raises :class:`ImageBuildError` on a non-zero exit.
    """
    b = _Builder(Path("."), cache_dir, None)
    step = f"run {ref}: {' '.join(argv)}"
    name = f"tpusim-check-{os.getpid()}"
    before = _existing(HOST_WRITES)
    try:
        subprocess.run(b.buildah.argv("rm", name), capture_output=True, check=False)
        made = subprocess.run(
            b.buildah.argv("from", "--name", name, "--pull=never", ref),
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise ImageBuildError(step, None, f"buildah from: {made.stderr.strip()}")
        done = subprocess.run(
            b.buildah.argv("run", "--network", "host", name, "--", *argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    finally:
        subprocess.run(b.buildah.argv("rm", name), capture_output=True, check=False)
        _clean_host_writes(before)
    if done.returncode != 0:
        raise ImageBuildError(step, None, f"exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def check_images(built: Images, cache_dir: Path) -> dict[str, float]:
    """Smoke-check the built images; seconds per check.

    The operator image runs ``tpuslice --help`` as its image user (not root); the
    Ray image imports ray and has what KubeRay's pods exec (bash, wget, grep).
    """
    checks: list[tuple[str, str, list[str], str]] = [
        ("operator: tpuslice --help", built.operator.ref, ["tpuslice", "--help"], "usage:"),
        ("operator: runs as 65532", built.operator.ref, ["id", "-u"], "65532"),
    ]
    if built.ray is not None:
        version = built.ray.ref.rsplit(":", 1)[1]
        checks += [
            ("ray: ray --version", built.ray.ref, ["ray", "--version"], version),
            (
                "ray: import ray, bash, wget, grep",
                built.ray.ref,
                [
                    "bash",
                    "-c",
                    "command -v wget grep >/dev/null"
                    " && python -c 'import ray; print(ray.__version__)'",
                ],
                version,
            ),
        ]
    times = {}
    for name, ref, argv, expect in checks:
        began = time.monotonic()
        out = run_in_image(cache_dir, ref, argv)
        if expect not in out:
            raise ImageBuildError(name, None, f"expected {expect!r} in the output, got {out!r}")
        times[name] = round(time.monotonic() - began, 2)
        log.info("%s: ok in %.1fs", name, times[name])
    return times


def clean_images(cache_dir: Path) -> None:
    """Remove ``<cache_dir>/images``: buildah's storage, tarballs and logs.

    Containers and images are removed through buildah first so that no overlay
    mount is left behind; then the directory goes.
    """
    b = _Builder(Path("."), cache_dir, None)
    if not b.dir.exists():
        return
    with _locked(b.dir):
        before = _existing(HOST_WRITES)
        if b.buildah.root.exists():
            subprocess.run(b.buildah.argv("rm", "--all"), capture_output=True, check=False)
            subprocess.run(
                b.buildah.argv("rmi", "--all", "--force"), capture_output=True, check=False
            )
        _clean_host_writes(before)
        # containers/storage's overlay driver bind-mounts its own directory
        # (<root>/overlay) and leaves that mount after every command: a plain
        # `rm -rf` of the cache would stop at it with EBUSY.
        for point in sorted(_mounts_below(b.dir), key=len, reverse=True):
            subprocess.run(["umount", point], capture_output=True, check=False)
        _remove_tree(b.buildah.runroot)
        _remove_tree(b.buildah.root)
    shutil.rmtree(b.dir)
