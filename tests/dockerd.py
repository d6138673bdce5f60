"""A private Docker engine for `docker://` tests and benchmarks, and the test image, made without a registry.

`Dockerd` starts Debian's dockerd as a child of the run, with a data root, exec root, pid file and
socket of its own under a short directory in /tmp (a Unix socket's path is limited to ~100
characters), with no bridge, no iptables rules, no masquerading and no forwarding: only the `host`
and `none` networks exist, and nothing listens on TCP. `stop` ends it by pid (PID 1 here reaps no
orphans: a dockerd left detached would become a zombie that looks alive).

`klbr_image` is the host's own Python (this interpreter's base prefix: its binary, its library, its
standard library) with a venv holding this run's ipykernel, and the shared libraries `ldd` lists
for them, as one root filesystem piped into `docker import`. The tar is cached outside the clone
(`$XDG_CACHE_HOME/klbr`, else ~/.cache/klbr) under a name hashed from its inputs, so only the first
run on a machine builds it; every run imports it into its own dockerd.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import os
import shutil
import signal
import string
import subprocess
import sys
import tarfile
import tempfile
import threading
from importlib import metadata
from pathlib import Path

DOCKERD = Path("/usr/sbin/dockerd")
DOCKER = Path("/usr/bin/docker")  # Debian's, by path: /usr/local/bin may hold another CLI
VENV = "/opt/klbr-venv"  # where the image's interpreter with ipykernel is
IMAGE_PYTHON = f"{VENV}/bin/python"


class Dockerd:
    def __init__(self) -> None:
        assert DOCKERD.exists() and DOCKER.exists(), "Debian's docker.io is missing: `make test` installs it (make engine-deps)"
        self.where = Path(tempfile.mkdtemp(prefix="kd", dir="/tmp"))
        self.socket = self.where / "s"
        self.host = f"unix://{self.socket}"
        self.process = subprocess.Popen(
            [str(DOCKERD), "--data-root", str(self.where / "d"), "--exec-root", str(self.where / "e"),
             "--pidfile", str(self.where / "p"), "--host", self.host, "--bridge=none", "--iptables=false",
             "--ip-masq=false", "--ip-forward=false", "--userland-proxy=false"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        said = []
        for line in self.process.stderr:  # its log, until it says its API listens
            said.append(line)
            if "API listen on" in line:
                # read on, or dockerd blocks on a full pipe
                threading.Thread(target=self.process.stderr.read, daemon=True).start()
                break
        else:
            self.stop()
            raise RuntimeError("dockerd did not start: " + "".join(said[-20:]))

    @property
    def environ(self) -> dict[str, str]:
        """What a kernel that runs `docker` against this daemon gets: Debian's CLI first on PATH."""
        return {"DOCKER_HOST": self.host, "PATH": f"{DOCKER.parent}:{os.environ['PATH']}"}

    def docker(self, *args: str, check: bool = True, input: bytes | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(DOCKER), "-H", self.host, *args], check=check, capture_output=True, text=input is None,
                              input=input, timeout=timeout)

    def containers(self, label: str = "klbr.kernel") -> list[str]:
        """Every container of a klbr kernel, running or not."""
        return self.docker("ps", "-aq", "--filter", f"label={label}").stdout.split()

    def pause(self) -> None:
        """The daemon stops answering (SIGSTOP), its containers left as they are."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.resume()
            for container in self.docker("ps", "-aq", check=False).stdout.split():
                self.docker("rm", "-f", container, check=False)
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # What dockerd leaves mounted (the host network's namespace, once a container used it), then its files.
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split()[4] for line in f if line.split()[4].startswith(f"{self.where}/")]
        for mount in reversed(mounts):
            subprocess.run(["umount", "--lazy", mount], check=False)  # noqa: S607
        subprocess.run(["rm", "-rf", str(self.where)], check=False)  # noqa: S607


def _cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "klbr" / "images"


def _libraries(paths: list[Path]) -> set[Path]:
    """The shared libraries `ldd` finds for `paths`, and the dynamic loader."""
    found: set[Path] = set()
    for path in paths:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False).stdout  # noqa: S607
        for line in out.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("/") and Path(word).exists():
                    found.add(Path(os.path.normpath(word)))
    return found


def _rootfs(venv: Path, out: Path) -> None:
    """The image's root filesystem as a tar: the base interpreter, the venv at `VENV`, libraries."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = base / "lib" / version
    skip = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "site-packages", "lib2to3"}
    binaries = [base / "bin" / version, *base.glob("lib/libpython*.so*")]
    with tarfile.open(out, "w") as tar:
        def add_tree(src: Path, arc: str, top_skip: set[str] = frozenset()) -> None:
            tar.add(src, arc, recursive=False)
            for root, dirs, files in os.walk(src):
                rel = Path(root).relative_to(src)
                if rel == Path("."):
                    dirs[:] = [d for d in dirs if d not in top_skip and not d.startswith("config-")]  # libpython.a
                for name in sorted(dirs) + sorted(files):
                    tar.add(Path(root) / name, f"{arc}/{rel / name}", recursive=False)

        for directory, mode in (("tmp", 0o1777), ("root", 0o755), ("etc", 0o755), ("opt", 0o755)):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        # The loader's names may be links: the files under them. What the venv holds goes with it.
        libraries = _libraries([*binaries, *venv.rglob("*.so*"), *(stdlib / "lib-dynload").glob("*.so")])
        for path in sorted(set(binaries) | {p for p in libraries if not p.is_relative_to(venv)}):
            tar.add(path.resolve(), str(path).lstrip("/"))
        tar.add(base / "bin" / "python3", str(base / "bin" / "python3").lstrip("/"))
        add_tree(stdlib, str(stdlib).lstrip("/"), skip)
        add_tree(venv, VENV.lstrip("/"))


def klbr_image(dockerd: Dockerd) -> str:
    """The test image's tag in `dockerd`: imported from the cached root filesystem (built first
    if the cache lacks it)."""
    ipykernel = metadata.version("ipykernel")
    inputs = (f"{sys.base_prefix} {sys.version} ipykernel=={ipykernel} {VENV}"
              + "".join(inspect.getsource(f) for f in (_libraries, _rootfs, klbr_image)))
    tag = f"klbr-test:{hashlib.sha256(inputs.encode()).hexdigest()[:16]}"
    cached = _cache() / f"{tag.replace(':', '-')}.tar"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cached.parent) as build:
            venv = Path(build) / "venv"
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
            (venv / "bin" / "python").unlink()  # a link to the base interpreter, wherever it is in the image
            (venv / "bin" / "python").symlink_to(Path(sys.base_prefix) / "bin" / "python3")
            site = next(venv.glob("lib/python*/site-packages"))
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-compile", "--target", str(site), f"ipykernel=={ipykernel}"], check=True,
                           capture_output=True)
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(site)], check=False)
            partial = Path(build) / "rootfs.tar"
            _rootfs(venv, partial)
            partial.rename(cached)
        for stale in cached.parent.glob("klbr-test-*.tar"):  # other inputs' (a run reading one keeps its file open)
            if stale != cached:
                stale.unlink(missing_ok=True)
    if dockerd.docker("image", "inspect", tag, check=False).returncode != 0:
        with open(cached, "rb") as f:
            # its venv first on PATH: `python3` is the one with ipykernel, as in an image made for it
            subprocess.run([str(DOCKER), "-H", dockerd.host, "import", "--change", f"ENV PATH={VENV}/bin:/usr/bin:/bin",
                            "-", tag], stdin=f, check=True,
                           capture_output=True, timeout=300)
    return tag



def gateway_image(dockerd: Dockerd, base: str) -> str:
    """An image for gateway_provisioners' DockerProvisioner, built on `base` in `dockerd` (no network):
    bash, its bootstrap script and Python launcher laid out as `jupyter-image-bootstrap install` lays
    them out (its binds on 0.0.0.0 made 127.0.0.1: its containers run on the host's network here, and
    nothing may listen past loopback), the launcher's pycryptodomex, `KERNEL_LANGUAGE=Python`, a user
    of uid 1000 (its launcher runs the kernel as that uid), and klbr's host client, which the kernel
    cannot hand such a container (nothing is shared with it)."""
    import gateway_provisioners  # noqa: PLC0415 — only the tests that use its provisioner need it

    from klbr_kernel import client_package  # noqa: PLC0415

    launchers = Path(gateway_provisioners.__file__).parent / "kernel-launchers"
    tag = f"klbr-gp:{base.split(':')[1]}"
    if dockerd.docker("image", "inspect", tag, check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory() as context:
        root = Path(context) / "root"
        bin_dir = root / "usr" / "local" / "bin"
        python = bin_dir / "kernel-launchers" / "python"
        for part in ("python", "shared"):  # the shared server listener replaces python's placeholder
            shutil.copytree(launchers / part, python, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        for script in (python / "scripts").glob("*.py"):  # the network rule here: nothing listens past loopback
            script.write_text(script.read_text().replace('"0.0.0.0"', '"127.0.0.1"'))
        bootstrap = string.Template((launchers / "bootstrap" / "bootstrap-kernel.sh").read_text())
        (bin_dir / "bootstrap-kernel.sh").write_text(bootstrap.safe_substitute(install_dir="/usr/local/bin"))
        (bin_dir / "bootstrap-kernel.sh").chmod(0o755)
        for command in ("/bin/bash", "/usr/bin/env"):
            for path in (Path(command), *_libraries([Path(command)])):
                target = root / str(path).lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path.resolve(), target)
        site = root / VENV.lstrip("/") / "lib" / next(Path(sys.base_prefix).glob("lib/python3*")).name / "site-packages"
        # the launcher's own need: it encrypts the connection info it sends back
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--target", str(site), "pycryptodomex"], check=True, capture_output=True)
        for name, text in client_package.files().items():
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        (root / "etc").mkdir()
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\njovyan:x:1000:100::/home/jovyan:/bin/bash\n")
        (root / "etc" / "group").write_text("root:x:0:\nusers:x:100:\n")
        (Path(context) / "home").mkdir()
        (Path(context) / "Dockerfile").write_text(
            f"FROM {base}\nCOPY root/ /\nCOPY --chown=1000:100 home/ /home/jovyan/\nENV KERNEL_LANGUAGE=Python\n"
            'CMD ["/usr/local/bin/bootstrap-kernel.sh"]\n')
        subprocess.run([str(DOCKER), "-H", dockerd.host, "build", "--network=none", "--quiet", "-t", tag, context],
                       check=True, capture_output=True, timeout=300, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    return tag
