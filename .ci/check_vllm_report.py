"""Exit 0 when a vLLM campaign report lists only documented vLLM defects,
each reached by a launch vLLM starts.

    python .ci/check_vllm_report.py REPORT_DIR/latest [--served]

Every finding of a campaign against vLLM carries ``known_defect`` (recorded
when it was found, cgsim.targets.vllm.known): a documented defect of that
release, or null.  A null one is a new vLLM defect to document or a cgsim
bug to fix: exit 1, naming it.  Every finding also carries the launch that
reaches it: vLLM's own config path (on the vLLM here) must build it for its
V2 model runner, into the manager config the finding's scenario judges
(micro-batched graphs only where its runner builds a micro-batch runner,
say), else exit 1.  With ``--served``, the campaign's runner share must
have served a launch through vLLM's own runner, and every launch it drew
was served or left by the budget (one it could not serve is an adapter
gap), else exit 1.  No report (the campaign could not run): exit 2.
"""

import json
import os
import sys


def main(argv):
    served = "--served" in argv
    argv = [a for a in argv if a != "--served"]
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    path = os.path.join(argv[0], "summary.json")
    try:
        with open(path, encoding="utf-8") as fh:
            summary = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"error: no campaign report at {path} ({exc}); the campaign did not run", file=sys.stderr)
        return 2
    env = summary.get("settings", {}).get("environment", {})
    findings = summary.get("findings", [])
    unknown = [f for f in findings if not f.get("known_defect")]
    unreached = [f for f in findings if not _starts(f.get("launch"), f.get("scenario"))]
    from cgsim.report.defects import runner_said

    for f in findings:
        said = runner_said(f)
        runner = f"; vLLM's runner: {said}" if said else ""
        print(f"{f['property']}: {f.get('known_defect') or 'NOT A DOCUMENTED DEFECT'}  ({f['id']}{runner})")
    for f in unreached:
        print(f"{f['property']}: its launch is not one vLLM starts on its V2 runner ({f['id']})")
    print(f"vLLM {env.get('vllm_version')}: {len(findings)} finding(s), {len(unknown)} not documented, "
          f"{len(unreached)} not reachable")
    if not summary.get("scenarios"):
        print("error: the campaign ran no scenario", file=sys.stderr)
        return 2
    share_ok = True
    if served:
        share = summary.get("coverage", {}).get("runner_share", {})
        not_served = summary.get("coverage", {}).get("runner_share_not_served", {})
        print(f"runner share: {share.get('served', 0)} launch(es) served, {share.get('differ', 0)} differ, "
              f"{share.get('unserved_budget', 0)} left by the budget")
        for why, n in not_served.items():
            print(f"runner share: {n} launch(es) NOT SERVED: {why}")
        share_ok = bool(share.get("served")) and not not_served
    return 1 if unknown or unreached or not share_ok else 0


def _starts(launch, scenario):
    """vLLM's EngineArgs build the launch for the V2 model runner, and the
    runner builds the scenario's manager config from it."""
    if not launch or not scenario:
        return False
    from cgsim.scenario import Scenario
    from cgsim.targets.base import TargetUnsupported
    from cgsim.targets.vllm.compat import require_vllm
    from cgsim.targets.vllm.engine import EngineLaunch, check_launch, runs_v2_runner

    require_vllm()
    built = EngineLaunch.of(launch["toy_model"], launch["args"], launch["env"])
    try:
        check_launch(built, Scenario.from_json(scenario).config)
        return runs_v2_runner(built)
    except TargetUnsupported:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
