"""Shared helpers of the real-browser console tests and the UI benchmark: the system Chromium
(Debian ``chromium`` + ``chromium-driver``) under Selenium 4, and a real console server
(:func:`fabricscope.api.app.create_app` served by uvicorn on 127.0.0.1, port 0)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("FABRICSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FABRICSCOPE_CHROMEDRIVER", "/usr/bin/chromedriver")
AXE_JS = os.environ.get("FABRICSCOPE_AXE_JS", "/var/cache/fabricscope/axe-core/axe.min.js")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (Path(path).is_file() or shutil.which(path)):
            return f"{path} not installed: apt-get install {pkg}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed: pip install selenium"
    return None


def make_driver(*, width: int = 1400, height: int = 900) -> Any:
    """A headless system Chromium with the browser console log captured."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--no-first-run",
                "--disable-extensions", "--disable-background-networking",
                "--enable-precise-memory-info"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


@dataclass
class Console:
    """A running console: its URL, token, state, services and server."""

    url: str
    token: str
    state: Any
    services: Any
    server: Any

    def stop(self) -> None:
        self.server.stop()
        self.services.close()


def start_console(*, servers: int = 8, twin: bool = True, speed: float = 20.0,
                  tick_s: float = 5.0, segment_s: float = 15.0, warmup_s: float = 45.0,
                  views: bool = True) -> Console:
    """Start a console over a rail-optimized fabric of ``servers`` servers: with the embedded
    twin (not started: call ``console.services.supervisor.start()``), or with only the
    inventory (``twin=False``: no supervisor, as for the 32k-GPU fabric view)."""
    from fabricscope.api.app import ApiSettings, create_app
    from fabricscope.api.server import start_server
    from fabricscope.fabric.catalog import build_fabric
    from fabricscope.service.console.services import ConsoleServices, build_twin_console
    from fabricscope.service.console.state import ConsoleState
    from fabricscope.service.console.twin_source import TwinSettings

    fabric = build_fabric("rail-optimized", {"servers": servers})
    if twin:
        state, services = build_twin_console(
            fabric, settings=TwinSettings(speed=speed, tick_s=tick_s, segment_s=segment_s,
                                          warmup_s=warmup_s), views=views)
    else:
        state, services = ConsoleState(fabric, mode="live"), ConsoleServices()
    token = secrets.token_urlsafe(24)
    settings = ApiSettings(token=token)
    server = start_server(create_app(state, settings, services), "127.0.0.1", 0)
    return Console(server.url, token, state, services, server)


@contextlib.contextmanager
def running_console(**kw: Any) -> Iterator[Console]:
    c = start_console(**kw)
    try:
        yield c
    finally:
        c.stop()


def sign_in(driver: Any, console: Console, route: str = "#/incidents", timeout: float = 20) -> None:
    """Open the console and sign in through the login form (as an operator would)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(console.url + "/" + route)
    driver.execute_script("sessionStorage.clear()")  # a session of an earlier test
    driver.refresh()
    wait = WebDriverWait(driver, timeout, poll_frequency=0.05)
    box = wait.until(ec.visibility_of_element_located((By.ID, "token")))
    box.send_keys(console.token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
    wait.until(lambda d: d.execute_script("return !!(window.fabricscope && "
                                          "window.fabricscope.page !== 'login' && "
                                          "window.fabricscope.page)"))


def wait_ready(driver: Any, page: str, timeout: float = 30) -> None:
    """Wait until the page ``page`` has rendered its data (``fabricscope.ready[page]``)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script("return !!(window.fabricscope && window.fabricscope.ready"
                                   f"[{page!r}])"))


def severe_logs(driver: Any) -> list[dict[str, Any]]:
    """The browser console's SEVERE entries since the last call."""
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def run_axe(driver: Any, axe_source: str) -> list[dict[str, Any]]:
    """Inject axe-core and return its violations on the current page (WCAG 2.x A/AA rules)."""
    driver.execute_script(axe_source)
    res = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', "
        "'wcag21a', 'wcag21aa', 'best-practice']}})"
        ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.slice(0, 5).map(n => n.target.join(' '))}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));")
    return list(res)
