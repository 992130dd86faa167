"""The ``sre-agent`` command line.

Exit status everywhere: 0 = ran and found nothing wrong, 1 = ran and found a
problem, 2 = bad input (config, flags, files). Configuration errors are printed one
per line with their key path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
import yaml

from agent import __version__
from agent.act.routing import Router
from agent.app.daemon import Agent
from agent.app.demo import DemoReceivers, run_demo
from agent.app.logs import configure_logging
from agent.cli import argtypes
from agent.cli import nccl as nccl_cmd
from agent.cli import oom as oom_cmd
from agent.cli import plan as plan_cmd
from agent.cli import triage as triage_cmd
from agent.cli.exitcodes import EXIT_BAD_INPUT, EXIT_OK, EXIT_PROBLEM
from agent.cli.silence import add_parsers as add_act_parsers
from agent.config import Config, bundled_rules_dir, load_config
from agent.diagnose.nccl.interconnects import check_configured
from agent.errors import AgentError, ConfigError, PromQLError, RuleError
from agent.gocompat import yamlv3
from agent.promql.rewrite import Matcher, parse_selector, rewrite
from agent.rules.files import load_rule_files, parametrize, parse_rule_file
from agent.rules.promtool_test import run_test_file
from agent.simulate.balance import BALANCERS
from agent.simulate.scenarios import SCENARIOS
from agent.simulate.server import Fleet, FleetConfig

__all__ = ["main"]

_DESCRIPTION = """\
A Prometheus-driven SRE agent for vLLM and LMDeploy fleets: scrapes /metrics and
NVML GPU stats, evaluates health rules, alerts (Slack, Alertmanager, webhooks) and
scales out, and tells you why a GPU ran out of memory.

Start here:  sre-agent demo          (agent + a simulated vLLM fleet, nothing else needed)
Then:        sre-agent check --config agent.yaml
             sre-agent run --config agent.yaml
Diagnose:    sre-agent plan -- vllm serve MODEL --tensor-parallel-size 4 ...
             sre-agent diagnose oom /var/log/vllm.log
             sre-agent nccl --parse all_reduce_perf.txt
Triage:      sre-agent triage --latest --config agent.yaml --out report.html
"""


#: Model seconds per wall second for the simulator and demo: past this a step covers minutes of
#: model time and the queueing model stops being one (1e300 spins the simulator forever).
_MAX_SPEED = 1000.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sre-agent", description=_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"sre-agent {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the agent daemon",
                         description="Run the agent: scrape targets and NVML, serve /metrics and the API. "
                                     "Without --config it scrapes http://127.0.0.1:8000/metrics (vLLM's "
                                     "default port) and local GPUs.")
    run.add_argument("--config", "-c", type=Path, help="YAML config file (default: built-in defaults)")
    run.add_argument("--once", action="store_true",
                     help="collect once, print {targets, alerts} as JSON on stdout and exit 0 (for cron/CI)")
    _log_flags(run)

    check = sub.add_parser("check", help="validate a config file and print the effective config",
                           description="Validate the config and print it with defaults filled in and secrets "
                                       "redacted. Exit 2 with one line per error.")
    check.add_argument("--config", "-c", type=Path, required=True)
    check.add_argument("--json", action="store_true", help="print JSON instead of YAML")

    rules = sub.add_parser("rules", help="check, test and export Prometheus rule files",
                           description="Work with Prometheus rule files on the agent's own engine. The same files "
                                       "load into Prometheus; `promtool check rules` / `promtool test rules` "
                                       "accept exactly what these accept.")
    rsub = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    rcheck = rsub.add_parser("check", help="validate rule files (default: the bundled rules/*.rules.yaml)")
    rcheck.add_argument("files", nargs="*", type=Path)
    rtest = rsub.add_parser("test", help="run promtool-format rule unit tests on the agent's engine")
    rtest.add_argument("files", nargs="+", type=Path)
    rexport = rsub.add_parser(
        "export", help="print rule files for a Prometheus (a PrometheusRule, or one plain rule file)",
        description="Print the rule files (default: the bundled ones) as one prometheus-operator PrometheusRule "
                    "or as one Prometheus rule file, validated first. For many clusters in one TSDB, --selector "
                    "adds label matchers to every series selector and --by adds labels to every aggregation "
                    "and on(...), as monitoring mixins do; the agent's rules.selector and rules.by do the same.")
    rexport.add_argument("files", nargs="*", type=Path)
    rexport.add_argument("--format", choices=["prometheusrule", "rules"], default="prometheusrule",
                         help="prometheusrule (Kubernetes object) or rules (a file for rule_files:)")
    rexport.add_argument("--name", default="sre-agent-rules", help="the PrometheusRule's name")
    rexport.add_argument("--namespace", default="monitoring", help="the PrometheusRule's namespace")
    rexport.add_argument("--selector", default="", metavar="MATCHERS",
                         help='label matchers added to every series selector, e.g. \'cluster="a"\'')
    rexport.add_argument("--by", default="", metavar="LABELS",
                         help="comma-separated labels added to every aggregation and on(...), e.g. cluster,namespace")

    sim = sub.add_parser("simulate", help="serve a simulated vLLM fleet's /metrics (on 127.0.0.1 by default)",
                         description="Serve realistic vLLM /metrics for N replicas driven by a queueing model. "
                                     "POST {\"replicas\": N} to the control port's /scale to scale. The "
                                     "replicas' GPUs are served under dcgm-exporter's names (DCGM_FI_DEV_*) at "
                                     "/metrics on the GPU exporter port (--dcgm-port, default --port minus 2), "
                                     "as one node's dcgm-exporter would; its URL is logged at start.")
    _fleet_flags(sim, default_port=8000, default_scenario="steady")
    sim.add_argument("--host", default="127.0.0.1",
                     help="address every replica and the control port listen on (default %(default)s; "
                          "0.0.0.0 in a container, so other containers reach it)")
    _log_flags(sim)

    demo = sub.add_parser("demo", help="run a simulated fleet and the agent together, with a live view",
                          description="Start the simulator and the agent, and show the fleet's live state "
                                      "as the agent sees it. Ctrl-C to stop.")
    _fleet_flags(demo, default_port=18000, default_scenario="story", default_balance="least_request")
    demo.add_argument("--listen", default="127.0.0.1:9400", type=_listen,
                      help="agent HTTP address (default %(default)s)")
    demo.add_argument("--interval", default="15s", type=argtypes.duration_text,
                      help="scrape and evaluation interval, in model time (default %(default)s)")
    demo.add_argument("--time-scale", type=argtypes.number(maximum=_MAX_SPEED), default=6.0, metavar="X",
                      help="model seconds per wall second, for the simulator and the agent alike: the rules' "
                           "`for` durations are kept in model time, so the story scenario (about 15.5 model "
                           "minutes) takes about 2.5 wall minutes at the default %(default)s (replaces --speed)")
    demo.add_argument("--duration", type=argtypes.number(inclusive=True), default=0.0,
                      help="stop after this many wall seconds (default: run until Ctrl-C)")
    demo.add_argument("--exit-after-story", action="store_true",
                      help="stop once every step of the story has happened and the summary is printed")
    demo.add_argument("--slack-token-file", type=Path,
                      help="also notify a real Slack workspace: a file holding a bot token (xoxb-...)")
    demo.add_argument("--slack-channel", default="", help="the Slack channel, with --slack-token-file")
    demo.add_argument("--slack-api-url", default="https://slack.com/api/", help=argparse.SUPPRESS)
    demo.add_argument("--alertmanager", action="append", default=[], metavar="URL",
                      help="also send every alert to this Alertmanager (base URL; repeatable)")
    demo.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])

    plan_cmd.add_parser(sub)
    oom_cmd.add_parser(sub)
    nccl_cmd.add_parser(sub)
    add_act_parsers(sub)
    triage_cmd.add_parser(sub)
    return p


def _log_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-format", choices=["console", "json"], help="override log.format")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override log.level")


def _fleet_flags(p: argparse.ArgumentParser, *, default_port: int, default_scenario: str,
                 default_balance: str = "even") -> None:
    p.add_argument("--replicas", type=int, default=3, help="vLLM replicas (default %(default)s)")
    p.add_argument("--lmdeploy", type=int, default=1, help="LMDeploy replicas (default %(default)s)")
    p.add_argument("--port", type=argtypes.port(), default=default_port,
                   help="first replica port (default %(default)s)")
    p.add_argument("--scenario", default=default_scenario, choices=sorted(SCENARIOS),
                   help="load pattern (default %(default)s)")
    p.add_argument("--generation", default="v1", choices=["v0", "v1"], help="vLLM metric names (default v1)")
    p.add_argument("--speed", type=argtypes.number(maximum=_MAX_SPEED), default=1.0,
                   help="model seconds per wall second (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, help="where replicas write their logs (oom scenario)")
    p.add_argument("--dcgm-port", type=argtypes.port(allow_off=True), default=None,
                   help="GPU exporter port: simulated dcgm-exporter /metrics of every replica's GPUs "
                        "(default: --port minus 2, a free port with --port 0; -1 turns it off)")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="GPUs per vLLM/LMDeploy replica on the simulated host (default %(default)s)")
    p.add_argument("--balance", default=default_balance, choices=list(BALANCERS),
                   help="how the simulated load balancer shares demand among vLLM replicas: even, or "
                        "least_request (Envoy's power-of-two-choices, so new replicas take the queue's "
                        "new arrivals) (default %(default)s)")


def _listen_text(text: str) -> str:
    """``HOST:PORT`` for ``demo --listen`` (checked here: the config it goes into would name ``server.listen``)."""
    _host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"must be HOST:PORT with a port from 0 to 65535, got {text!r:.60}")
    return text


_listen = argtypes.checked(_listen_text)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging("console", "warning")  # stderr; commands with their own log flags reconfigure
    try:
        if getattr(args, "func", None) is not None:
            return int(args.func(args))
        if args.command == "check":
            return _check(args)
        if args.command == "run":
            return _run(args)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "rules":
            return _rules(args)
        if args.command == "demo":
            configure_logging("console", args.log_level)
            if args.slack_token_file is not None and not args.slack_channel:
                print("--slack-channel is required with --slack-token-file", file=sys.stderr)
                return EXIT_BAD_INPUT
            receivers = DemoReceivers(slack_token_file=args.slack_token_file, slack_channel=args.slack_channel,
                                      slack_api_url=args.slack_api_url, alertmanager=tuple(args.alertmanager))
            return asyncio.run(run_demo(fleet_config(args), listen=args.listen, interval=args.interval,
                                        time_scale=args.time_scale, duration=args.duration, receivers=receivers,
                                        exit_after_story=args.exit_after_story))
    except ConfigError as exc:
        for line in exc.errors:
            print(f"config error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuleError as exc:
        for line in exc.errors:
            print(f"rule error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_BAD_INPUT


def _load(args: argparse.Namespace) -> Config:
    """The validated config, with the checks of the layers above the config model too."""
    config = load_config(getattr(args, "config", None), os.environ)
    check_configured(config.diagnostics.nccl.interconnect)
    return config


def _check(args: argparse.Namespace) -> int:
    config = _load(args)
    Router(config)  # route-tree rules Alertmanager enforces (ConfigError naming the key path)
    data = config.redacted()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")
    print(f"config OK: {args.config}", file=sys.stderr)
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    config = _load(args)
    configure_logging(args.log_format or config.log.format, args.log_level or config.log.level)
    if args.once:
        return asyncio.run(_once(Agent(config)))
    asyncio.run(_serve_forever(Agent(config)))
    return EXIT_OK


async def _once(agent: Agent) -> int:
    try:
        await agent.collect_once()
    finally:
        await agent.stop()
    print(json.dumps({"targets": agent.targets_json(), "alerts": agent.alerts_json()}, indent=2))
    return EXIT_OK


async def _serve_forever(agent: Agent) -> None:
    await agent.run_until(_stop_event())


def _stop_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, for a clean shutdown."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _simulate(args: argparse.Namespace) -> int:
    configure_logging(args.log_format or "console", args.log_level or "info")
    return asyncio.run(_simulate_async(args))


async def _simulate_async(args: argparse.Namespace) -> int:
    fleet = Fleet(replace(fleet_config(args), host=args.host))
    await fleet.start()
    log = structlog.get_logger("agent.simulate")
    log.info("simulator serving", targets=fleet.targets, control=fleet.control_url, gpu_exporter=fleet.dcgm_url,
             scenario=args.scenario)
    for url in fleet.targets:
        print(url, flush=True)
    try:
        await _stop_event().wait()
    finally:
        await fleet.stop()
    return EXIT_OK


def fleet_config(args: argparse.Namespace) -> FleetConfig:
    """FleetConfig from the shared simulate/demo flags."""
    dcgm: int | None = args.dcgm_port
    if dcgm is None:
        dcgm = max(args.port - 2, 0) if args.port else 0
    return FleetConfig(
        replicas=args.replicas, base_port=args.port, scenario=args.scenario, generation=args.generation,
        lmdeploy_replicas=args.lmdeploy, seed=args.seed, speed=args.speed, log_dir=args.log_dir,
        dcgm_port=None if dcgm < 0 else dcgm, tensor_parallel=args.tensor_parallel, balance=args.balance,
    )


def _rule_files(files: list[Path]) -> list[Path]:
    return files or sorted(bundled_rules_dir().glob("*.rules.yaml"))


def _rules(args: argparse.Namespace) -> int:
    if args.rules_command == "check":
        return _rules_check(_rule_files(args.files))
    if args.rules_command == "test":
        return _rules_test(args.files)
    try:
        selector = parse_selector(args.selector) if args.selector.strip() else []
    except PromQLError as exc:
        print(f"--selector: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    by = [b.strip() for b in args.by.split(",") if b.strip()]
    return _rules_export(_rule_files(args.files), args.name, args.namespace, fmt=args.format, selector=selector, by=by)


def _rules_check(files: list[Path]) -> int:
    """Like ``promtool check rules``: one block per file, non-zero if any file fails."""
    failed = False
    for path in files:
        print(f"Checking {path}")
        try:
            groups = parse_rule_file(path)
        except RuleError as exc:
            failed = True
            print("  FAILED:\n" + "\n".join(f"    {e}" for e in exc.errors))
            continue
        print(f"  SUCCESS: {sum(len(g.rules) for g in groups)} rules found")
    return EXIT_PROBLEM if failed else EXIT_OK


def _rules_test(files: list[Path]) -> int:
    """Like ``promtool test rules``: PASSED/FAILED per file, non-zero if any failed."""
    failed = False
    for path in files:
        print(f"Unit Testing:  {path}")
        result = run_test_file(path)
        if result.ok:
            print("  SUCCESS\n")
        else:
            failed = True
            print("  FAILED:")
            for f in result.failures:
                print("    " + f.replace("\n", "\n    "))
            print()
    return EXIT_PROBLEM if failed else EXIT_OK


def _rules_export(files: list[Path], name: str, namespace: str, *, fmt: str = "prometheusrule",
                  selector: list[Matcher] | None = None, by: list[str] | None = None) -> int:
    """The rule files as one ``monitoring.coreos.com/v1`` PrometheusRule (prometheus-operator) or one
    rule file, with the mixin parameters applied to every expression."""
    parametrize(load_rule_files(files), selector=selector, by=by)  # validate first: never export what would not load
    groups: list[Any] = []
    for path in files:
        groups.extend((yamlv3.load_file(path) or {}).get("groups") or [])
    if selector or by:
        for g in groups:
            for r in g.get("rules") or []:
                r["expr"] = rewrite(str(r["expr"]), selector=selector, by=by)
    if fmt == "rules":
        print(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000), end="")
        return EXIT_OK
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "sre-agent", "app.kubernetes.io/part-of": "sre-agent"}},
        "spec": {"groups": groups},
    }
    print(yaml.safe_dump(obj, sort_keys=False, width=1000), end="")
    return EXIT_OK
