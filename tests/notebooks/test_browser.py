"""A real browser: JupyterLab headless, ``04_tune_batching.ipynb`` opened in Chromium at a laptop's
1280x800, its cells run, the Tuner panel rendered and checked: in each of its tabs no element runs
past the output area's right edge, no label is clipped and every slider shows its value (and at
1024 px wide nothing runs past the edge); a click on Measure updates the plot and the table; a small
sweep (three queue delays) changes the plot while it runs, once per config measured, and ends with
a recommended config marked in the ranking.

Chromium is Debian's ``/usr/bin/chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs it),
driven by Playwright's sync API (``pip install -e '.[dev]'``); Playwright's own browser download is
never used. The notebook opened is a copy with small parameters injected the way papermill does it,
its outputs cleared and its last cell (``server.stop()``) left out: the Tuner needs a live server after
the last cell. Screenshots are kept in ``artifacts/browser/``: ``04_tune_batching.png`` (the page after
Measure; failures leave ``04_tune_batching-failure.png`` beside it), and of the panel alone at 1280 px
wide, ``04_tune_batching-tuner.png`` after the sweep and ``04_tune_batching-tuner-sweep.png`` during it
(docs/images/tuner.png and tuner-sweep.png are these).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.notebooks.notebook_run import SMALL, inject_parameters, stop_cell_index, without_outputs

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "04_tune_batching.ipynb"
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
START_TIMEOUT_S = 60  # JupyterLab answering
LOAD_TIMEOUT_S = 60  # the notebook open with its kernel idle
RUN_TIMEOUT_S = 150  # all cells run, the Tuner panel shown
MEASURE_TIMEOUT_S = 60  # a click on Measure redraws the plot

# Lab's settings for the test: every cell rendered (no windowing, which leaves off-screen cells
# unrendered), no news or update checks (no network here).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]' (or pip install 'playwright>=1.40'); "
                    "the browser is the system chromium, no `playwright install` needed", pytrace=False)
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian's package; .ci/run installs it)",
                    pytrace=False)
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


class Lab:
    """``jupyter lab`` in a subprocess, on a free port, with a random token; its log in a file."""

    def __init__(self, root: Path, env: dict[str, str], log: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        settings = root.parent / "lab-settings"
        for name, values in LAB_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(values))
        env = {**env, "JUPYTERLAB_SETTINGS_DIR": str(settings),
               "JUPYTERLAB_WORKSPACES_DIR": str(root.parent / "lab-workspaces"),
               "JUPYTER_RUNTIME_DIR": str(root.parent / "jupyter-runtime"),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        command = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}",
                   f"--IdentityProvider.token={self.token}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root}",
                   "--ServerApp.open_browser=False", "--ServerApp.port_retries=0",
                   "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-root")  # CI runs as root
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(command, cwd=root, env=env, stdout=self._log_file,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def api(self, path: str, method: str = "GET", timeout: float = 5) -> bytes:
        request = urllib.request.Request(f"{self.base}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"jupyter lab exited with {self.process.returncode}:\n{_tail(self.log)}")
            with contextlib.suppress(OSError):
                json.loads(self.api("/api/status", timeout=2))
                return
            time.sleep(0.5)
        raise AssertionError(f"jupyter lab did not answer on port {self.port} in {timeout:.0f} s:\n{_tail(self.log)}")

    def stop(self) -> None:
        """Shut down the server and its kernels: the REST shutdown first, then terminate, then kill —
        the kernels too (they run in their own sessions, out of the server's process group)."""
        try:
            import psutil

            children = psutil.Process(self.process.pid).children(recursive=True)
        except Exception:
            children = []
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.api("/api/shutdown", method="POST", timeout=10)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(10)
        for child in children:
            with contextlib.suppress(Exception):
                child.terminate()
                child.wait(5)
            with contextlib.suppress(Exception):
                child.kill()
        self._log_file.close()


@contextlib.contextmanager
def jupyter_lab(root: Path, env: dict[str, str], log: Path) -> Iterator[Lab]:
    lab = Lab(root, env, log)
    try:
        lab.wait_ready(START_TIMEOUT_S)
        yield lab
    finally:
        lab.stop()


# In the page: the open notebook's state, read from its DOM (prompts, kernel status in the toolbar).
_NOTEBOOK_STATE_JS = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const prompts = [...panel.querySelectorAll('.jp-InputArea-prompt')].map(p => p.textContent.trim());
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  const kernel = [...document.querySelectorAll('.jp-StatusBar-TextItem')]  // "Python 3 (ipykernel) | Idle"
    .find(e => e.textContent.includes(' | '));
  return {
    cells: panel.querySelectorAll('.jp-Cell').length,
    running: prompts.filter(p => p.includes('*')).length,
    executed: prompts.filter(p => /\\[\\d+\\]/.test(p)).length,
    indicator: indicator ? indicator.getAttribute('data-status') : null,
    kernel: kernel ? kernel.textContent.trim() : null,
  };
}"""

# The visible text of error outputs (tracebacks), for a failure message.
_ERRORS_JS = """() => [...document.querySelectorAll(
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
  .map(e => e.textContent).filter(t => /Error|Traceback/.test(t)).map(t => t.slice(-1500))"""


def _wait_kernel_idle(page, timeout: float) -> None:
    """The toolbar's indicator and the status bar both say idle, three polls in a row."""
    deadline = time.monotonic() + timeout
    idle = 0
    state: dict = {}
    while idle < 3:
        state = page.evaluate(_NOTEBOOK_STATE_JS) or {}
        ok = state.get("indicator") == "idle" and (state.get("kernel") or "").endswith("Idle")
        idle = idle + 1 if ok else 0
        assert time.monotonic() < deadline, f"the kernel is not idle after {timeout:.0f} s; notebook state {state}"
        time.sleep(0.3)


# A laptop's window, as the issue tried the panel; the panel's tabs, each checked in turn.
LAPTOP = {"width": 1280, "height": 800}
TABS = ("Batching", "Load", "Payload", "Sweep", "Replay")

# In the page: what of the panel's visible part breaks the layout — elements whose right edge runs
# past the output area's, labels whose text is cut (scrollWidth over clientWidth), sliders with no
# readout shown. Hidden elements (the other tabs) have no box and are skipped.
_LAYOUT_JS = """(panel) => {
  const area = panel.closest('.jp-OutputArea-output') || panel.parentElement;
  const edge = area.getBoundingClientRect().right + 1;
  const name = e => (e.className && e.className.baseVal === undefined ? '.' + [...e.classList].join('.') : e.tagName)
                    + ' "' + (e.textContent || '').trim().slice(0, 40) + '"';
  const shown = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const past = [...panel.querySelectorAll('*')].filter(shown)
    .filter(e => e.getBoundingClientRect().right > edge)
    .map(e => name(e) + ' right=' + Math.round(e.getBoundingClientRect().right) + ' edge=' + Math.round(edge));
  const clipped = [...panel.querySelectorAll('.widget-label, .widget-label-basic, label, .lm-TabBar-tabLabel, button')]
    .filter(shown).filter(e => e.scrollWidth > e.clientWidth + 1).map(name);
  const sliders = [...panel.querySelectorAll('.widget-slider')].filter(shown);
  const bare = sliders.filter(s => { const r = s.querySelector('.widget-readout');
                                     return !r || !shown(r) || !r.textContent.trim(); }).map(name);
  return {edge, past, clipped, sliders: sliders.length, bare};
}"""


def check_layout(page, panel, *, width: int, tabs: tuple[str, ...], labels: bool = True) -> int:
    """Each tab of the panel in turn at the viewport's ``width``: nothing past the output area's right
    edge, no clipped label (when ``labels``), a readout on every slider. Returns the sliders seen."""
    sliders = 0
    for title in tabs:
        panel.locator(".lm-TabBar-tab", has_text=title).first.click()
        page.wait_for_timeout(300)  # the tab's content laid out
        found = panel.evaluate(_LAYOUT_JS)
        where = f"at {width} px, tab {title}"
        assert not found["past"], f"{where}: past the output area's edge ({found['edge']}): {found['past'][:8]}"
        if labels:
            assert not found["clipped"], f"{where}: clipped labels: {found['clipped']}"
        assert not found["bare"], f"{where}: sliders without a readout: {found['bare']}"
        sliders += found["sliders"]
    panel.locator(".lm-TabBar-tab", has_text=tabs[0]).first.click()
    assert sliders >= 4, f"at {width} px: only {sliders} sliders seen across the tabs"
    return sliders


# In the page: every change of the plot's src, with whether the sweep had ended when it came.
_WATCH_JS = """([panel, image]) => {
  window.__tunerPlots = [];
  new MutationObserver(() => window.__tunerPlots.push(
      {src: image.src, done: /sweep done|error:/.test(panel.innerText)}))
    .observe(image, {attributes: true, attributeFilter: ['src']});
}"""


def run_sweep(page, panel, image, shot: Path, *, timeout: float) -> None:
    """A small sweep from the panel (three queue delays, one instance): the plot must change while it
    runs, once per measured config, before "sweep done"; a screenshot of the panel mid-sweep."""
    panel.locator(".lm-TabBar-tab", has_text="Sweep").first.click()
    panel.locator(".widget-text", has_text="delays").locator("input").fill("0,100,500")
    panel.locator(".widget-text", has_text="instances").locator("input").fill("1")
    panel.locator(".lm-TabBar-tab", has_text="Batching").first.click()
    page.wait_for_timeout(300)  # the typed values synced to the kernel
    page.evaluate(_WATCH_JS, [panel.element_handle(), image.element_handle()])
    panel.locator("button", has_text="Sweep").first.click()
    page.wait_for_function("() => window.__tunerPlots.some(p => !p.done)", timeout=timeout * 1000, polling=100)
    page.wait_for_function("panel => /sweep: \\d of 3/.test(panel.innerText)", arg=panel.element_handle(),
                           timeout=10_000, polling=100)
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(shot))
    page.wait_for_function("panel => /sweep done|error:/.test(panel.innerText)", arg=panel.element_handle(),
                           timeout=timeout * 1000, polling=250)
    text = panel.inner_text()
    assert "sweep done" in text and "FAILED" not in text, f"the sweep did not end well:\n{text}"
    plots = page.evaluate("() => window.__tunerPlots")
    during = {p["src"] for p in plots if not p["done"]}
    assert len(during) >= 2, f"the plot changed {len(during)} time(s) while the sweep ran (3 configs): {plots}"
    assert panel.locator("table tbody tr").count() >= 4  # the measured point and the sweep's three
    assert "★ recommended" in panel.locator("table").first.inner_text()


def prepare(notebook: Path, target: Path, work: Path) -> None:
    """``notebook`` as the browser runs it, written to ``target``: small parameters (WORK: ``work``), no
    outputs, and without its last cell, ``server.stop()``, so that the Tuner's server stays up."""
    book = inject_parameters(nbformat.read(notebook, as_version=4), {**SMALL, "WORK": str(work)})
    del book.cells[stop_cell_index(book)]
    nbformat.write(without_outputs(book), target)


def run_tuner_in_browser(notebook: Path, workdir: Path, sync_playwright, *, measure_timeout: float) -> Path:
    """Open ``notebook`` (a copy in ``workdir``, see :func:`prepare`) in JupyterLab in Chromium, run all
    cells, click Measure on the Tuner panel and wait for the plot and table to change. Returns the
    screenshot."""
    root = workdir / "lab"
    root.mkdir()
    prepare(notebook, root / notebook.name, workdir / "work")
    env = dict(os.environ)
    log = workdir / "jupyter-lab.log"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / f"{notebook.stem}.png"
    panel_shot = ARTIFACTS / f"{notebook.stem}-tuner.png"
    sweep_shot = ARTIFACTS / f"{notebook.stem}-tuner-sweep.png"
    failure_shot = ARTIFACTS / f"{notebook.stem}-failure.png"
    screenshot.unlink(missing_ok=True)
    panel_shot.unlink(missing_ok=True)
    sweep_shot.unlink(missing_ok=True)
    failure_shot.unlink(missing_ok=True)
    console: list[str] = []

    with jupyter_lab(root, env, log) as lab, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = None
        step = "open the notebook"
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.set_default_timeout(30_000)
            page.goto(f"{lab.base}/lab/tree/{notebook.name}?token={lab.token}", wait_until="domcontentloaded")

            # the notebook shown, its kernel started and idle
            page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="visible", timeout=LOAD_TIMEOUT_S * 1000)
            _wait_kernel_idle(page, LOAD_TIMEOUT_S)

            step = "run all cells"
            for attempt in range(3):  # a click that lands while the kernel connects can be lost: retry
                page.get_by_role("menuitem", name="Run", exact=True).click()
                page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    state = page.evaluate(_NOTEBOOK_STATE_JS) or {}
                    if state.get("running") or state.get("executed"):
                        break
                    time.sleep(0.25)
                else:
                    assert attempt < 2, f"Run > Run All Cells started no cell; notebook state {state}"
                    continue
                break

            step = "wait for the Tuner panel"
            measure = page.locator(".jupyter-widgets button", has_text="Measure").first
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while True:
                state = page.evaluate(_NOTEBOOK_STATE_JS) or {}
                shown = measure.count() > 0 and measure.is_visible()
                if shown and state.get("running") == 0 and state.get("indicator") == "idle":
                    break
                errors = page.evaluate(_ERRORS_JS)
                if errors and state.get("running") == 0 and state.get("indicator") == "idle":
                    raise AssertionError("a cell failed:\n" + "\n---\n".join(errors))
                if time.monotonic() > deadline:
                    raise AssertionError(f"no idle kernel with a visible Measure button after {RUN_TIMEOUT_S} s; "
                                         f"notebook state {state}; errors: {errors}")
                time.sleep(0.5)

            panel = page.locator(".triton-nb-tuner").first
            panel.wait_for(state="visible")
            image = panel.locator("img.widget-image").first
            image.wait_for(state="visible")
            before = image.get_attribute("src")
            assert before, "the Tuner's plot (ipywidgets.Image) has no src"
            assert panel.locator("table tbody tr").count() == 0, "points table not empty before Measure"

            step = "check the layout at 1280x800"
            check_layout(page, panel, width=LAPTOP["width"], tabs=TABS)

            step = "click Measure"
            measure.scroll_into_view_if_needed()
            measure.click()
            page.wait_for_function(
                """([image, before]) => image.src && image.src !== before
                                        && image.closest('.triton-nb-tuner').querySelector('table tbody tr')""",
                arg=[image.element_handle(), before], timeout=measure_timeout * 1000, polling=250)
            step = "wait for the new plot and the status line"
            image.evaluate("img => img.decode()")  # the new PNG loaded (rejects if it is not a valid image)
            page.wait_for_function(  # the status line: "measured <config>: ... infer/s" (or an error)
                "panel => /measured #|error:|FAILED/.test(panel.innerText)", arg=panel.element_handle(), polling=250)
            text = panel.inner_text()
            assert "error:" not in text and "FAILED" not in text, f"the Tuner reports an error:\n{text}"
            panel.scroll_into_view_if_needed()
            page.screenshot(path=str(screenshot))

            step = "check the layout at 1024 wide"
            page.set_viewport_size({"width": 1024, "height": 800})
            check_layout(page, panel, width=1024, tabs=TABS, labels=False)
            page.set_viewport_size({"width": LAPTOP["width"], "height": 1500})  # taller: the whole panel in view

            step = "run a sweep"
            run_sweep(page, panel, image, sweep_shot, timeout=measure_timeout * 3)
            panel.scroll_into_view_if_needed()
            panel.screenshot(path=str(panel_shot))
            return screenshot
        except Exception as exc:
            if page is not None:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(failure_shot))
            raise AssertionError(
                f"browser test failed at step {step!r}: {exc}\n"
                f"screenshot: {failure_shot}\n"
                f"browser console errors (last 20):\n" + "\n".join(console[-20:]) + "\n"
                f"jupyter lab log (tail):\n{_tail(log)}") from exc
        finally:
            browser.close()


def test_tune_batching_in_chromium(tmp_path):
    sync_playwright = _playwright()
    assert NOTEBOOK.is_file(), f"{NOTEBOOK} is missing"
    started = time.monotonic()
    screenshot = run_tuner_in_browser(NOTEBOOK, tmp_path, sync_playwright, measure_timeout=MEASURE_TIMEOUT_S)
    assert screenshot.is_file() and screenshot.stat().st_size > 10_000, screenshot
    print(f"\nscreenshot: {screenshot} ({time.monotonic() - started:.0f} s)")
