"""The agent's own dashboard (``sre-agent``), from its ``/metrics``.

Series the agent writes about its targets carry those targets' ``job`` and ``instance``; a
Prometheus scraping the agent (``honor_labels: false``, the default) keeps the agent's own
as ``job``/``instance`` and renames the target's to ``exported_job``/``exported_instance``,
which is what the legends print. Thresholds are those of rules/agent.rules.yaml.
"""

from __future__ import annotations

from dashboards.kit import Board, Q, Var
from dashboards.rules import factor, threshold

__all__ = ["board"]

_VARS = (Var("job", "job", "sre_agent_build_info"), Var("instance", "instance", "sre_agent_build_info"))
SCRAPE_FAILED = threshold("SREAgentScrapeFailures", "up")
SCRAPE_SLOW = threshold("SREAgentScrapeSlow", "scrape_duration_seconds")
SCRAPE_SLOW_SHARE = factor("SREAgentScrapeSlow", "scrape_duration_seconds")
_TARGET = "{{exported_job}} {{exported_instance}}"


def board() -> Board:
    b = Board("sre-agent", "sre-agent", "The agent itself: alerts, notifications, scaling, diagnostics, scrapes, "
              "rule evaluation, store and state database.", tags=["agent"], variables=_VARS)

    def rate(metric: str, by: str) -> str:
        return f"sum by ({by}) (rate({b.sel(metric)}[$__rate_interval]))"

    def increase(metric: str, by: str) -> str:
        return f"sum by ({by}) (increase({b.sel(metric)}[$__rate_interval]))"

    b.row("Alerts and notifications")
    b.timeseries(
        "Alerts by state and severity", unit="short", stack=True,
        queries=[Q(f"sum by (state, severity) ({b.sel('sre_agent_alerts')})", "{{state}} {{severity}}")],
        what="Active alerts the agent evaluates, by state (pending, firing) and severity label.",
        bad="critical firing: page now. Nothing at all, not even Watchdog (severity none): rules are not "
            "evaluated.",
        runbooks=["Watchdog"],
    )  # fmt: skip
    b.timeseries(
        "Notifications sent per receiver", unit="cps",
        queries=[Q(rate("sre_agent_notifications_sent_total", "receiver"), "{{receiver}}")],
        what="Notifications each receiver acknowledged, per second.",
        bad="A receiver that stops acknowledging while alerts fire (Watchdog always does): the path to it is "
            "broken.",
        runbooks=["Watchdog"],
    )  # fmt: skip
    b.timeseries(
        "Notification failures per receiver", unit="cps",
        queries=[Q(rate("sre_agent_notifications_failed_total", "receiver"), "given up {{receiver}}"),
                 Q(rate("sre_agent_notifications_retried_total", "receiver"), "retried {{receiver}}")],
        what="Notifications given up on (rejected, or older than notify.give_up_after) and delivery attempts "
             "that will be retried.",
        bad="Any given up: a notification was lost; retries that go on: the receiver is down or rejects us.",
        runbooks=["Watchdog"],
    )  # fmt: skip
    b.timeseries(
        "Outbox depth", unit="short",
        queries=[Q(f"sum by (receiver) ({b.sel('sre_agent_outbox_depth')})", "{{receiver}}")],
        what="Notifications waiting in the state database's outbox per receiver.",
        bad="Growing: the receiver does not acknowledge; notifications are late (and lost if the database "
            "cannot be written).",
        runbooks=["Watchdog", "SREAgentStateWritesFailing"],
    )  # fmt: skip
    b.row("Scaling and diagnostics")
    b.timeseries(
        "Scale actions", unit="short", bars=True,
        queries=[Q(increase("sre_agent_scale_actions_total", "service, direction, outcome"),
                   "{{service}} {{direction}} {{outcome}}")],
        what="Scale decisions per interval by service, direction and outcome (acted, dry_run, refused by a "
             "cooldown or a bound).",
        bad="Refused scale-outs while the scale-out alert fires: the service is at max_replicas or in its "
            "cooldown; acted scale-outs that repeat: the new replicas do not take the load.",
        runbooks=["VLLMScaleOutNeeded", "LMDeployScaleOutNeeded"],
    )  # fmt: skip
    b.timeseries(
        "Desired replicas", unit="short",
        queries=[Q(f"max by (service) ({b.sel('sre_agent_desired_replicas')})", "{{service}}")],
        what="Replicas the agent wants per service (what an HPA or KEDA reads).",
        bad="At the service's max_replicas while the scale-out alert keeps firing: raise the bound or the "
            "capacity per replica.",
        runbooks=["VLLMScaleOutNeeded"],
    )  # fmt: skip
    b.timeseries(
        "nccl-tests bus bandwidth", unit="GBs",
        queries=[Q(f"max by (collective, stat) ({b.sel('sre_agent_nccl_busbw_gbps')})", "{{collective}} {{stat}}")],
        what="Bus bandwidth of the last nccl-tests run (peak and average, GB/s).",
        bad="Far under the fabric's (under 1/10 of NVLink): tensor parallelism crosses a slow link.",
        runbooks=["diagnosis-nccl-bandwidth-low", "diagnosis-nccl-cross-node-tp"],
    )  # fmt: skip
    b.stat(
        "nccl-tests verdict", unit="bool_on_off", thresholds=[(1, "green")], base="red",
        queries=[Q(f"min by (collective) ({b.sel('sre_agent_nccl_ok')})", "{{collective}} ok"),
                 Q(f"max by (collective) ({b.sel('sre_agent_nccl_wrong_total')}) > 0", "{{collective}} wrong")],
        what="Whether the last nccl-tests run passed, and its wrong-result count where there were any.",
        bad="Off: the run failed or bandwidth was low; any wrong results: a GPU or link corrupts data.",
        runbooks=["diagnosis-nccl-failed", "diagnosis-nccl-wrong-results"],
    )  # fmt: skip
    b.stat(
        "nccl-tests age", unit="s", thresholds=[(86400, "yellow")],
        queries=[Q(f"time() - max by (collective) ({b.sel('sre_agent_nccl_last_run_timestamp_seconds')})",
                   "{{collective}}")],
        what="Time since the last nccl-tests run.",
        bad="Older than the configured schedule: the check does not run.",
        runbooks=["diagnosis-nccl-failed"],
    )  # fmt: skip
    b.timeseries(
        "Findings by kind", unit="short", bars=True, width=24,
        queries=[Q(increase("sre_agent_findings_total", "kind"), "{{kind}}")],
        what="Diagnosis findings posted per interval, by kind (OOM, KV cache, NCCL, GPU hardware...).",
        bad="Any finding links its own diagnosis runbook; repeated ones of a kind mean the cause is not fixed.",
        runbooks=["diagnosis-gpu-oom-runtime", "diagnosis-kv-cache-capacity"],
    )  # fmt: skip
    b.row("Scrapes")
    b.timeseries(
        "Targets up", unit="short",
        queries=[Q(f"sum by (exported_job) ({b.sel('sre_agent_target_up')})", "up {{exported_job}}"),
                 Q(f"count by (exported_job) ({b.sel('sre_agent_target_up')} == 0)", "down {{exported_job}}")],
        what="Targets whose last scrape by the agent succeeded, and those that failed, per scraped job.",
        bad="Any down for 10 minutes: the target is dead or unreachable.",
        runbooks=["SREAgentTargetDown", "VLLMTargetDown", "LMDeployTargetDown"],
    )  # fmt: skip
    scrapes, fails = b.sel("sre_agent_target_scrapes_total"), b.sel("sre_agent_target_scrape_failures_total")
    b.timeseries(
        "Failed scrapes", unit="percentunit", min_=0, max_=1, thresholds=[(SCRAPE_FAILED, "red")],
        queries=[Q(f"rate({fails}[$__rate_interval]) / (rate({scrapes}[$__rate_interval]) > 0)", _TARGET)],
        what=f"Share of each target's scrapes that failed. Dashed line: the alert's {SCRAPE_FAILED:.0%}.",
        bad=f"Above {SCRAPE_FAILED:.0%} over 15 minutes while some succeed: every failure is a gap in rates.",
        runbooks=["SREAgentScrapeFailures"],
    )  # fmt: skip
    b.timeseries(
        "Scrape duration", unit="s", thresholds=[(SCRAPE_SLOW, "red")],
        queries=[Q(b.sel("sre_agent_target_scrape_duration_seconds"), _TARGET),
                 Q(f"max({b.sel('sre_agent_scrape_cycle_duration_seconds')})", "whole cycle")],
        what=f"Duration of each target's last scrape and of the whole cycle. Dashed line: {SCRAPE_SLOW:g} s, "
             f"{SCRAPE_SLOW_SHARE:.0%} of the default 10 s timeout, the alert's limit.",
        bad=f"Above {SCRAPE_SLOW_SHARE:.0%} of the scrape timeout for 10 minutes: one slower scrape and the "
            "target reads as down.",
        runbooks=["SREAgentScrapeSlow"],
    )  # fmt: skip
    b.timeseries(
        "Samples per scrape", unit="short",
        queries=[Q(b.sel("sre_agent_target_scrape_samples"), f"scraped {_TARGET}"),
                 Q(b.sel("sre_agent_target_stored_samples"), f"stored {_TARGET}")],
        what="Samples in each target's last payload and those the keep-list stored.",
        bad="A jump in scraped samples: a label explosion on the target; stored near scraped: the keep-list "
            "keeps everything (a selector without a metric name).",
        runbooks=["SREAgentScrapeSlow", "SREAgentStoreSeriesLimitReached"],
    )  # fmt: skip

    def by_group(metric: str) -> str:
        """Per rule group, labelled by its name (rule_group is "<file path>;<name>", as Prometheus writes it)."""
        return f'label_replace(max by (rule_group) ({b.sel(metric)}), "group", "$1", "rule_group", ".*;(.*)")'

    b.row("Rules, store and state")
    b.timeseries(
        "Rule evaluation time", unit="s",
        queries=[Q(by_group("sre_agent_rule_group_last_duration_seconds"), "{{group}}")],
        what="Wall time of each rule group's last evaluation.",
        bad="Close to the group's interval (15 s): evaluations fall behind and alerts come late.",
        runbooks=["Watchdog"],
    )  # fmt: skip
    b.timeseries(
        "Failing rules", unit="short",
        queries=[Q(by_group("sre_agent_rule_group_failing_rules"), "{{group}}")],
        what="Rules whose last evaluation failed, per group.",
        bad="Any: those alerts cannot fire; the agent's log names the rule and the error.",
        runbooks=["Watchdog"],
    )  # fmt: skip
    b.timeseries(
        "Store series", unit="short",
        queries=[Q(f"max({b.sel('sre_agent_store_series')})", "series"),
                 Q(f"max({b.sel('sre_agent_store_max_series')}) > 0", "store.max_series"),
                 Q(f"sum({rate('sre_agent_store_refused_series_total', 'instance')})", "refused per second")],
        what="Series in the agent's store against store.max_series, and new series refused per second.",
        bad="Any refused: new servers, models or label values are not stored and their alerts cannot fire.",
        runbooks=["SREAgentStoreSeriesLimitReached"],
    )  # fmt: skip
    b.timeseries(
        "State database", unit="short",
        queries=[Q(increase("sre_agent_state_write_failures_total", "instance"), "write failures {{instance}}"),
                 Q(f"max by (instance) ({b.sel('sre_agent_state_held_work')})", "held in memory {{instance}}")],
        what="State-database writes that failed per interval, and work held in memory until a write succeeds.",
        bad="Failures in every 5-minute window: notifications live only in memory and a restart loses them.",
        runbooks=["SREAgentStateWritesFailing"],
    )  # fmt: skip
    b.stat(
        "NVML available", unit="bool_on_off", thresholds=[(1, "green")], base="red", width=12,
        queries=[Q(b.sel("sre_agent_nvml_up"), "{{instance}}")],
        what="Whether the agent's NVML poller reads the GPUs.",
        bad="Off for 10 minutes on a GPU host: no GPU metrics and no GPU alerts.",
        runbooks=["SREAgentNVMLUnavailable"],
    )  # fmt: skip
    b.stat(
        "Agent up", unit="bool_on_off", thresholds=[(1, "green")], base="red", width=12,
        queries=[Q(f'{b.sel("up")} and on (job, instance) last_over_time({b.sel("sre_agent_build_info")}[1h])',
                   "{{instance}}")],
        what="Whether Prometheus' last scrape of the agent's /metrics succeeded (targets that served the agent's "
             "metrics in the last hour).",
        bad="Off: the agent is down; nothing evaluates the rules it owns.",
        runbooks=["SREAgentTargetDown", "Watchdog"],
    )  # fmt: skip
    return b
