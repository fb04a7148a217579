"""serve's status page: ``GET /`` (or ``/status``) at the one address.

One self-contained HTML page (inline style, no script, no request but the
page itself) that reloads itself every ``REFRESH_S`` seconds: the model and
its split, every rank's host and what the split verdict said of its memory,
the line at the front (in flight, waiting, the limits), requests and tokens
per second over the last minute, the median time to first token, the
restarts with their causes, and the last probe. Its counts are read from
the same counters /metrics gives, at the same moment.
"""

from __future__ import annotations

import html
import time

from mlxcluster.serve.status import WINDOW_S, StatusView

REFRESH_S = 5


def _ago(now: float, then: float) -> str:
    return f"{max(0.0, now - then):.0f} s ago"


def render(view: StatusView) -> bytes:
    e = html.escape
    state = ("stopping: " + view.stopping) if view.stopping else (
        "ready" if view.ready else ("up, last probe unanswered" if view.up else view.why_down))
    colour = "#1a7f37" if view.ready and not view.stopping else "#b35900"
    ranks = "".join(f"<tr><td>{rank}</td><td>{e(host)}</td></tr>" for rank, host in view.ranks)
    hosts = "".join(f"<li>{e(line)}</li>" for line in view.hosts) or \
        "<li>not judged (no facts of the hosts)</li>"
    statuses = ", ".join(f"{e(code)}: {count}" for code, count in view.by_status) or "none yet"
    ttft = "none in the last minute" if view.ttft_median_s is None else \
        f"{view.ttft_median_s * 1000:.0f} ms"
    restarts = "".join(f"<li>{time.strftime('%H:%M:%S', time.localtime(at))}: {e(cause)}</li>"
                       for at, cause in view.restarts) or "<li>none</li>"
    if view.probe is None:
        probe = "none yet"
    else:
        p = view.probe
        probe = (f"answered in {p.seconds:.2f} s, {_ago(view.now, p.at)}" if p.ok else
                 f"not answered ({e(p.error)}), {_ago(view.now, p.at)}")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_S}">
<link rel="icon" href="data:,">
<title>mlxcluster serve: {e(view.model)}</title>
<style>
body {{ font: 15px/1.45 -apple-system, system-ui, sans-serif; margin: 24px; color: #1f2328; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 16px; margin: 22px 0 6px; }}
.state {{ font-weight: 600; color: {colour}; }}
.grid {{ display: grid; grid-template-columns: repeat(4, minmax(150px, 1fr)); gap: 10px; }}
.tile {{ border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; }}
.tile b {{ display: block; font-size: 22px; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 14px 2px 0; text-align: left; }}
small {{ color: #57606a; }}
</style></head><body>
<h1>{e(view.model)}</h1>
<div>{e(view.split)} split over {len(view.ranks)} rank(s) at <code>{e(view.address)}</code>,
run {e(view.run_id)}: <span class="state" id="state">{e(state)}</span></div>
<h2>Now</h2>
<div class="grid">
<div class="tile">in flight<b id="in-flight">{view.in_flight}</b><small>at most {view.max_in_flight} at once</small></div>
<div class="tile">waiting<b id="waiting">{view.waiting}</b><small>at most {view.queue}; more get 429</small></div>
<div class="tile">requests/s<b id="requests-per-s">{view.requests_per_s:.2f}</b><small>last {WINDOW_S:.0f} s</small></div>
<div class="tile">tokens/s<b id="tokens-per-s">{view.tokens_per_s:.1f}</b><small>generated, last {WINDOW_S:.0f} s</small></div>
<div class="tile">time to first token<b id="ttft">{ttft}</b><small>median, last {WINDOW_S:.0f} s</small></div>
<div class="tile">requests answered<b id="requests">{view.requests}</b><small>{statuses}</small></div>
<div class="tile">tokens generated<b id="tokens">{view.completion_tokens}</b><small>since serve started</small></div>
<div class="tile">launches<b id="launches">{view.launches}</b><small>{len(view.restarts)} restart(s) below</small></div>
</div>
<h2>Ranks</h2>
<table><tr><th>rank</th><th>host</th></tr>{ranks}</table>
<ul>{hosts}</ul>
<h2>Last probe</h2>
<div id="probe">{probe}</div>
<h2>Restarts</h2>
<ul id="restarts">{restarts}</ul>
<p><small>Reloads every {REFRESH_S} s; the same counts as /metrics.
{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(view.now))}</small></p>
</body></html>
"""
    return page.encode()
