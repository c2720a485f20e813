#!/usr/bin/env python3
"""Each safety fix is proven by a test that fails without it.

For every fix listed below, copy the project to a temporary directory, undo the fix there (a one-line
change of the code that implements it), and run the regression test that stands for it: the test must
fail. Exit 1 if any test still passes without its fix. Two copies are checked side by side
(`REGRESSION_WORKERS`, default 2); `make test` runs it.
Names given as arguments run only the fixes whose name contains one of them.

    .venv/bin/python scripts/check_regressions.py [NAME ...]
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = "tests/unit/test_safety_regressions.py"
FOUND = "tests/model/test_found_by_model.py"  # reproductions of what the model-based suite found
LOOP = "tests/unit/test_loop_safety.py"  # breaks in the shell around the decision
UNITS = "tests/unit/test_delivery_units.py"  # delivery units and who closes a record in each delivery mode

# (fix, file, the code of the fix, the code without it, the test that must then fail)
MUTATIONS = [
    (
        'fence',
        'coordinator/snapshot.py',
        '    if mono >= checked_at + session / 2:\n',
        '    if False:\n',
        'test_no_post_once_the_session_may_have_lapsed',
    ),
    (
        'fence-counts-from-the-checks-start',
        'coordinator/execute.py',
        '            checked_at = started if checked_at is None else checked_at\n',
        '            checked_at = mono() if checked_at is None else checked_at\n',
        'tests/unit/test_approve_operation.py::test_the_session_fence_counts_from_before_the_stores_check_not_after_it',
    ),
    (
        'withdraw-before-recover',
        'coordinator/decide/drain.py',
        '        if not mine:\n            return ""',
        '        if True:\n            return ""',
        'test_a_vm_whose_withdrawal_fails_stays_out_while_zookeeper_shows_its_ack',
    ),
    (
        'withdraw-only-when-gone',
        'coordinator/decide/decision.py',
        'if snap.me in record.acks and key not in holding_keys]',
        'if snap.me in record.acks and key not in by_key]',
        'test_ack_is_withdrawn_before_the_vm_serves_when_resources_shrink',
    ),
    (
        'gone-debounce',
        'coordinator/snapshot.py',
        '    return (sighting.misses >= 2 and sighting.missed_at is not None\n'
        '            and sighting.missed_at - sighting.last >= gone_after)',
        '    return sighting.misses >= 1',
        'test_a_one_read_flap_never_puts_a_drained_vm_back',
    ),
    (
        'done-keeps-admission',
        'coordinator/store/zookeeper.py',
        'drop=("admitted", "approval"), started_at=started_at,',
        'drop=(), started_at=started_at,',
        'test_a_reused_event_id_inherits_no_admission',
    ),
    (
        'draining-for-shrinks',
        'coordinator/decide/drain.py',
        '        if key not in holding and not is_gone(',
        '        if False and key not in holding and not is_gone(',
        'test_restart_with_imds_and_zookeeper_down_stays_drained',
    ),
    (
        'assume-worst',
        'coordinator/agent.py',
        '        restart = Restart(assume_worst=state_file.unreadable, from_store=',
        '        restart = Restart(assume_worst=False, from_store=',
        'test_unreadable_state_file_holds_every_event_naming_the_vm',
    ),
    (
        'out-marks-ignored',
        'coordinator/decide/budget.py',
        '    for vm, mark in cluster.out.items():\n        out[vm] = ',
        '    for vm, mark in {}.items():\n        out[vm] = ',
        'test_budget_counts_a_rebooting_vm_until_it_is_back',
    ),
    (
        'no-self-drain',
        'coordinator/decide/drain.py',
        '    if grace is not None and snap.cut_off_for',
        '    if False and snap.cut_off_for',
        'test_a_vm_cut_off_from_zookeeper_drains_itself_before_its_peers_stop_waiting',
    ),
    (
        'keep-one-not-budget',
        'coordinator/snapshot.py',
        '        return self.max_events is not None or self.max_vms is not None or self.keep_one_serving',
        '        return self.max_events is not None or self.max_vms is not None',
        'test_keep_one_serving_holds_without_a_budget',
    ),
    (
        'a-restart-found-serving-runs-only-what-always-recovers',
        'coordinator/decide/local.py',
        '        recover_all=local.phase is not Phase.UNKNOWN or local.recover_all_at_start,\n',
        '        recover_all=True,\n',
        'test_a_restart_that_finds_the_vm_serving_runs_only_the_recovers_that_always_run',
    ),
    (
        'no-write-ahead',
        'coordinator/decide/local.py',
        '    save_first = PersistedState(Phase.DRAINING.value, frozenset(holding), snap.now) if start_drain '
        'else None\n',
        '    save_first = None\n',
        'test_the_drain_state_is_on_disk_before_the_first_drain_action_runs',
    ),
    (
        'no-return-wait',
        'coordinator/decide/drain.py',
        '        if snap.mono - local.job_done_at >= policy.back_after:',
        '        if True:',
        'test_a_recovered_vm_counts_as_serving_only_after_the_return_wait',
    ),
    (
        'unapprovable-at-once',
        'coordinator/decide/drain.py',
        '        return policy.unapprovable_at_once  # nothing',
        '        return True  # nothing',
        'test_an_unapprovable_event_drains_just_in_time_and_holds_no_budget',
    ),
    (
        'dry-run-saves',
        'coordinator/dryrun.py',
        '        if not op.changes:\n',
        '        if not op.changes or isinstance(op, SaveState):\n',
        'test_dry_run_writes_no_state_and_no_node_and_moves_no_probe',
    ),
    (
        'dry-run-decides-from-the-view-as-read',
        'coordinator/dryrun.py',
        '        return replace(view, records=records)',
        '        return ClusterView(view.members | {vm}, view.leader, False, records, view.connection,'
        ' view.known | {vm}, view.absent_since)',
        'test_a_dry_run_decides_from_the_group_as_it_is_and_says_what_holds_its_event',
    ),
    (
        'dry-run-serves-no-probe',
        'coordinator/runtime.py',
        '            probe_listen=None if dry_run else settings.probe.listen,',
        '            probe_listen=settings.probe.listen,',
        'tests/integration/test_run_start.py::test_a_dry_run_beside_the_agent_takes_neither_of_its_ports_and_serves_no_probe',
    ),
    (
        'a-record-holds-its-admission-and-approval',
        'coordinator/store/payloads.py',
        '        return self.mirrored == (stat.version, stat.cversion)',
        '        return False',
        'tests/integration/test_zookeeper_watched_view.py::test_a_change_costs_a_reader_the_nodes_it_touched_not_the_groups_lists',
    ),
    (
        'an-agent-lists-acks-by-name',
        'coordinator/store/zk_watch.py',
        '        self._ack_times = ack_times',
        '        self._ack_times = True',
        'tests/integration/test_zookeeper_watched_view.py::test_a_change_costs_a_reader_the_nodes_it_touched_not_the_groups_lists',
    ),
    (
        'not-before-overflow',
        'coordinator/models.py',
        '    try:\n        return parsed.astimezone(UTC)\n    except OverflowError:',
        '    try:\n        return parsed.astimezone(UTC)\n    except ZeroDivisionError:',
        'test_odd_not_before_neither_crashes_a_cycle_nor_hides_the_event',
    ),
    (
        'not-counted-drain',
        'coordinator/decide/budget.py',
        '    return {vm: tuple(keys) for vm, keys in out.items()',
        '    return {vm: tuple(keys) for vm, keys in {}.items()',
        'test_a_drain_for_an_event_without_not_before_counts_in_the_budget',
    ),
    (
        'budget-counts-this-vm-as-its-cycle-leaves-it',
        'coordinator/decide/decision.py',
        '    budget = weigh_budget(by_key, counted, snap, policy)\n',
        '    budget = weigh_budget(by_key, cluster, snap, policy)\n',
        'tests/unit/test_policy.py::test_the_leader_counts_itself_out_of_rotation_before_the_view_shows_its_out_mark',
    ),
    (
        'budget-at-approval',
        'coordinator/decide/approval.py',
        '            reasons = (over.weighed_at_approval(),) if over is not None else ()',
        '            reasons = ()',
        'test_no_approval_that_would_leave_no_vm_in_rotation_even_after_admission',
    ),
    (
        'peers-confirmed-by-probe',
        'coordinator/decide/budget.py',
        '    for vm in unconfirmed_peers(cluster, snap, policy):\n        out.setdefault(vm, [])\n',
        '',
        'test_a_peer_whose_agent_just_died_does_not_count_as_serving',
    ),
    (
        'peers-asked-again-at-approval',
        'coordinator/agent.py',
        '            snap = replace(snap, peers_confirmed_at=asked_at, peers=self._peers.confirm())\n',
        '            snap = replace(snap, peers_confirmed_at=asked_at)\n',
        'test_an_approval_asks_the_peers_again_instead_of_trusting_the_last_round',
    ),
    (
        'out-vm-under-every-key',
        'coordinator/decide/budget.py',
        '            for unit in [_unit_out_for(key, vm, events) for key in keys] or [f"vm:{vm}"]:\n',
        '            for unit in [_unit_out_for(key, vm, events) for key in keys[:1]] or [f"vm:{vm}"]:\n',
        f'{FOUND}::test_a_vm_drained_by_hand_still_acked_for_an_event_that_dropped_it_counts_that_event_in_maintenance',
    ),
    (
        'an-earlier-instance-is-an-event-of-its-own',
        'coordinator/decide/budget.py',
        '        return f"{key} (an earlier instance)"\n',
        '        return key\n',
        f'{FOUND}::test_a_reused_event_id_is_admitted_beside_its_earlier_instance_that_still_holds_a_vm_out',
    ),
    (
        'drain-wait-from-job-start',
        'coordinator/agent.py',
        '            local = replace(local, drain_started=max(local.drain_started, live.drain_began))\n',
        '            pass\n',
        f'{FOUND}::test_a_drain_queued_behind_a_slow_recovery_is_acknowledged_before_the_drain_wait',
    ),
    (
        'records-seen-without-a-new-reading',
        'coordinator/evidence.py',
        '    evidence = after_view(evidence, cluster, mono)\n',
        '    evidence = after_view(evidence, cluster if document is not None else None, mono)\n',
        'tests/unit/test_poller.py::test_a_record_published_since_the_leaders_last_poll_is_not_taken_for_one_gone',
    ),
    (
        'a-reading-counts-once',
        'coordinator/agent.py',
        '        return self._observe_group(started, reading if new and document is not None else None, document)\n',
        '        return self._observe_group(started, reading if document is not None else None, document)\n',
        'tests/unit/test_poller.py::test_a_reading_counts_once_towards_an_event_being_gone',
    ),
    (
        'approval-on-a-read-after-approvable',
        'coordinator/decide/approval.py',
        '    held = [i.key for i in approve if snap.read_sent < since[i.key]]\n',
        '    held = [i.key for i in approve if False]\n',
        'tests/unit/test_poller.py::test_resources_changed_since_the_last_reading_are_seen_before_approving',
    ),
    (
        'fresh-read-kept-after-peers-asked-again',
        'coordinator/agent.py',
        '            snap = replace(snap, peers_confirmed_at=asked_at, peers=self._peers.confirm())\n',
        '            snap = replace(snap, peers_confirmed_at=asked_at, peers=self._peers.confirm(),'
        ' read_sent=float("inf"))\n',
        'tests/unit/test_poller.py::test_peers_asked_again_do_not_release_an_approval_held_for_a_fresh_read',
    ),
    (
        'no-approval-on-an-old-reading',
        'coordinator/agent.py',
        '        document = reading.document if age <= self._pace.document_fresh else None\n',
        '        document = reading.document\n',
        'tests/unit/test_poller.py::test_no_approval_rests_on_a_reading_older_than_one_and_a_half_polls',
    ),
    (
        'kept-answers-wait-for-the-watch-events-before-the-reads-answers',
        'coordinator/store/zk_watch.py',
        '            if fetch.kept or fetch.kept_memos:\n'
        '                self._session.watch_events_delivered(fetch.deadline)\n',
        '',
        'tests/integration/test_zookeeper_watched_view.py::'
        'test_a_kept_record_whose_watch_event_comes_during_the_read_is_read_again',
    ),
    (
        'a-read-mixing-a-stale-kept-answer-is-made-again',
        'coordinator/store/zk_watch.py',
        '        return (None if stale(fetch.kept, fetch.kept_memos, fired) else fetch), result\n',
        '        return fetch, result\n',
        'tests/integration/test_zookeeper_watched_view.py::'
        'test_a_kept_record_whose_watch_event_comes_during_the_read_is_read_again',
    ),
    (
        'an-answer-whose-watch-fired-during-the-read-is-not-kept',
        'coordinator/store/zk_nodes.py',
        '            if self._fired is not None and key[1] in self._fired:\n                return\n',
        '',
        'tests/integration/test_zookeeper_watched_view.py::'
        'test_a_watch_firing_during_a_read_makes_the_next_read_read_again',
    ),
    (
        'a-pause-holds-approvals',
        'coordinator/decide/approval.py',
        '(pause_holds(cluster.paused), window_holds(policy, snap.now))',
        '(window_holds(policy, snap.now),)',
        'tests/unit/test_policy.py::test_a_pause_holds_every_approval_and_says_who_paused_and_why',
    ),
    (
        'the-gate-checks-the-pause',
        'coordinator/store/gate.py',
        '    if f.paused:\n',
        '    if False:\n',
        'tests/integration/test_controls.py::test_a_pause_reaches_every_agents_view_and_the_gate_refuses_until_resumed',
    ),
    (
        'no-early-approval-outside-the-windows',
        'coordinator/decide/events.py',
        '    if ev.not_before is None or not in_windows(policy.windows, snap.now):\n',
        '    if ev.not_before is None:\n',
        'tests/unit/test_policy.py::test_outside_the_windows_an_event_is_neither_admitted_nor_drained_early_nor_approved',
    ),
    (
        'nodes-created-with-the-acl',
        'coordinator/store/zk_session.py',
        '        "default_acl": list(options.acls.default) if options.acls is not None else None,\n',
        '        "default_acl": None,\n',
        'tests/integration/test_zookeeper_security.py::test_only_the_agents_identity_can_write_what_agents_trust',
    ),
    (
        'open-namespace-closed-at-start',
        'coordinator/store/zk_context.py',
        '        if same_acl(current, acls.base):\n',
        '        if True:\n',
        'tests/integration/test_zookeeper_security.py::test_an_open_namespace_is_closed_when_the_agents_get_credentials',
    ),
    (
        'unreadable-pause-still-pauses',
        'coordinator/store/zk_view.py',
        '    except NoAuthError:\n        return _unreadable_pause(paths.pause, exists)\n',
        '    except ():\n        return _unreadable_pause(paths.pause, exists)\n',
        'tests/integration/test_zookeeper_security.py::'
        'test_a_pause_node_the_agents_cannot_read_still_pauses_and_the_rest_is_read',
    ),
    (
        'event-id-listed-twice',
        'coordinator/decide/events.py',
        '        if ev.key is not None and listed[ev.key] > 1:\n',
        '        if False:\n',
        'test_an_event_id_listed_twice_is_never_approved_early',
    ),
    (
        'huge-incarnation',
        'coordinator/models.py',
        'Field(alias="DocumentIncarnation", ge=0, le=MAX_INCARNATION)',
        'Field(alias="DocumentIncarnation", ge=0)',
        'tests/integration/test_hostile_imds.py::test_an_incarnation_of_thousands_of_digits_is_malformed_not_a_crash',
    ),
    (
        'invalid-utf8-replaced',
        'coordinator/models.py',
        '            content: object = raw.decode("utf-8")\n',
        '            content: object = raw.decode("utf-8", "replace")\n',
        'tests/integration/test_hostile_imds.py::test_invalid_utf8_in_a_name_is_refused_not_replaced',
    ),
    (
        'body-size-limit',
        'coordinator/imds.py',
        '                if size > self._max_body:\n',
        '                if False:\n',
        'tests/integration/test_hostile_imds.py::test_a_body_without_length_is_cut_at_the_limit',
    ),
    (
        'garbage-ack-counted-in-the-view',
        'coordinator/store/zk_view.py',
        '            if ack is not None:\n                acks[name] = ack.at\n',
        '            acks[name] = ack.at if ack is not None else 0.0\n',
        'tests/integration/test_hostile_zookeeper.py::test_the_view_does_not_count_a_garbage_ack',
    ),
    (
        'gate-reads-every-ack',
        'coordinator/store/zk_gate.py',
        '                acked_at = AckNode.of_vm(ack_data, paths.ack(asked.event_id, name), name).at\n',
        '                pass\n',
        'tests/integration/test_hostile_zookeeper.py::test_the_gate_refuses_an_approval_over_a_garbage_ack',
    ),
    (
        'gate-ack-held-by-the-vms-session',
        'coordinator/store/gate.py',
        '        if not ack.member_session or ack.session != ack.member_session:\n',
        '        if False:\n',
        'tests/integration/test_hostile_zookeeper.py::'
        'test_the_gate_refuses_a_well_formed_ack_that_vm1s_own_session_does_not_hold',
    ),
    (
        'cut-off-since-before-start',
        'coordinator/snapshot.py',
        '            return float("inf")\n        return self.mono - self.connected_at',
        '            return self.mono - self.started\n        return self.mono - self.connected_at',
        LOOP + '::test_a_restarted_agent_cut_off_from_zookeeper_counts_itself_cut_off_since_before_it_started',
    ),
    (
        'granted-session-lapse',
        'coordinator/snapshot.py',
        '    timeout = max(policy.session_timeout, granted or 0.0, 2 * policy.zk_tick)\n',
        '    timeout = policy.session_timeout - policy.zk_tick\n',
        LOOP + '::test_a_cut_off_vm_serves_only_once_the_session_the_server_granted_has_lapsed',
    ),
    (
        'posted-never-cleared',
        'coordinator/decide/decision.py',
        '    posted = still_posted(local.posted, set(by_key), snap, policy)\n',
        '    posted = local.posted\n',
        LOOP + '::test_a_reused_event_id_is_approved_again_by_the_same_approver',
    ),
    (
        'fence-reads-the-pause',
        'coordinator/snapshot.py',
        '    held = pause_holds(paused) or window_holds(policy, now)\n',
        '    held = window_holds(policy, now)\n',
        LOOP + '::test_a_pause_made_while_the_approval_is_retried_stops_the_retries',
    ),
    (
        'fence-checks-the-window',
        'coordinator/snapshot.py',
        '    held = pause_holds(paused) or window_holds(policy, now)\n',
        '    held = pause_holds(paused)\n',
        LOOP + '::test_a_maintenance_window_that_closes_while_the_approval_is_retried_stops_the_retries',
    ),
    (
        'gone-timed-by-requests',
        'coordinator/snapshot.py',
        '            missed_at = sent if sighting.missed_at is None else max(sighting.missed_at, sent)\n',
        '            missed_at = answered\n',
        LOOP + '::test_two_misses_whose_answers_came_late_do_not_make_an_event_gone',
    ),
    (
        'held-by-key',
        'coordinator/agent.py',
        '        held = frozenset(e.upper() for e in saved.draining_for) if saved else frozenset()\n',
        '        held = saved.draining_for if saved else frozenset()\n',
        LOOP + '::test_a_state_file_spelling_an_event_id_otherwise_than_imds_now_does_still_holds_the_vm',
    ),
    (
        'granted-timeout-learnt',
        'coordinator/store/zk_session.py',
        '        record_granted_timeout(client, self._granted_by_server)\n',
        '',
        'tests/integration/test_session_timing.py::test_a_server_with_a_3s_tick_grants_6s_to_an_agent_asking_for_4s',
    ),
    (
        'records-never-listed-judged-by-holders',
        'coordinator/evidence.py',
        '        seen[key] = Sighting(mono, listed=False)\n',
        '        seen[key] = Sighting(mono)\n',
        LOOP + '::test_a_group_whose_vms_see_only_their_own_events_still_approves_early',
    ),
    (
        'duplicate-member-left-alone',
        'coordinator/store/zk_membership.py',
        '        if reason is None:\n            raise duplicate_member(',
        '        if False:\n            raise duplicate_member(',
        'tests/integration/test_zookeeper_store.py::'
        'test_a_second_agent_with_the_same_vm_name_leaves_the_first_ones_node_untouched',
    ),
    (
        'duplicate-member-left-alone-on-the-fake',
        'coordinator/store/zk_membership.py',
        '        if reason is None:\n            raise duplicate_member(',
        '        if False:\n            raise duplicate_member(',
        'tests/integration/test_store_contract.py::'
        'test_a_second_agent_with_the_same_vm_name_is_refused_and_the_first_keeps_its_node[fake]',
    ),
    (
        'predecessor-process-must-be-gone',
        'coordinator/store/members.py',
        '    if running(pid, _text(theirs, "pid_start")) is False:\n',
        '    if True:\n',
        'tests/integration/test_store_contract.py::'
        'test_a_second_agent_with_the_same_vm_name_is_refused_and_the_first_keeps_its_node[zookeeper]',
    ),
    (
        'predecessor-on-this-host-only',
        'coordinator/store/members.py',
        '    if host is None or host != our_host:\n',
        '    if host is None:\n',
        'tests/integration/test_store_contract.py::'
        'test_a_node_not_provably_this_vms_previous_agent_is_never_replaced[zookeeper-another host]',
    ),
    (
        'predecessor-started-earlier',
        'coordinator/store/members.py',
        '    if started is None or our_started is None or not started < our_started:\n',
        '    if started is None or our_started is None:\n',
        'tests/integration/test_zookeeper_watched_view.py::test_join_sees_that_another_session_took_the_member_node',
    ),
    (
        'children-move-the-record-version',
        'coordinator/store/zk_records.py',
        '    transaction.set_data(path, node.rewritten(stat, 1, **{**copied, child: payload}), version=stat.version)\n',
        '    transaction.check(path, stat.version)\n',  # a check alone: the children's cversion is not checked
        'tests/integration/test_zookeeper_store.py::'
        'test_an_admission_created_while_mark_done_lists_the_children_does_not_survive_it',
    ),
    (
        'admission-on-the-record-as-read',
        'coordinator/store/zk_records.py',
        '            result = create_on_record(ctx, client, path, node, stat, "admitted", AdmittedNode(by=vm, at=at), '
        'deadline)\n',
        '            ctx.session.wait(client.create_async(ctx.paths.admitted(event_id), '
        'AdmittedNode(by=vm, at=at).to_bytes()), deadline)\n'
        '            result = WriteResult.DONE\n',
        'tests/integration/test_zookeeper_store.py::'
        'test_an_admission_decided_before_mark_done_landed_is_not_written_on_the_done_record',
    ),
    (
        'approval-on-the-record-as-checked',
        'coordinator/store/zk_gate.py',
        '        written = create_on_record(ctx, client, paths.event(event_id), record_node, record_stat, "approval",\n'
        '                                   ApprovalNode.of(approval), deadline)\n',
        '        wait(client.create_async(paths.approval(event_id), ApprovalNode.of(approval).to_bytes()), deadline)\n'
        '        written = WriteResult.DONE\n',
        'tests/integration/test_zookeeper_store.py::'
        'test_an_approval_checked_before_mark_done_landed_is_not_written_on_the_done_record',
    ),
    (
        'admits-no-done-record',
        'coordinator/store/zk_records.py',
        '            if node.done_at is not None:\n                return WriteResult.MISSING\n'
        '            result = create_on_record(ctx, client, path, node, stat, "admitted",',
        '            result = create_on_record(ctx, client, path, node, stat, "admitted",',
        'tests/integration/test_store_contract.py::test_a_record_marked_done_is_admitted_no_more[fake]',
    ),
    (
        'duplicate-stays-out-of-rotation',
        'coordinator/decide/decision.py',
        '    kept_out = bool(holding) or bool(snap.duplicate)\n',
        '    kept_out = bool(holding)\n',
        LOOP + '::test_a_serving_agent_that_finds_another_agent_in_its_place_leaves_rotation',
    ),
    (
        'store-only-not-before-in-seconds',
        'coordinator/decide/events.py',
        '            return self.stored_not_before\n',
        '            dt = __import__("datetime")\n'
        '            stored = self.stored_not_before\n'
        '            return None if stored is None else dt.datetime.fromtimestamp(stored, dt.UTC).timestamp()\n',
        LOOP + '::test_a_record_known_only_from_the_store_with_a_notbefore_at_the_calendars_end_is_weighed_not_a_crash',
    ),
    (
        'no-admission-on-a-fresh-record-alone',
        'coordinator/decide/events.py',
        '        if snap.mono - sighting.last < policy.gone_after:\n',
        '        if False:\n',
        LOOP + '::test_the_leader_admits_no_record_on_its_word_alone_while_its_own_documents_may_still_list_it',
    ),
    (
        'serve-only-on-a-read-after-acks-released',
        'coordinator/decide/drain.py',
        '    if snap.read_sent >= acks_released_by(snap, policy):\n',
        '    if snap.cut_off_for >= session_lapses_after(policy, snap.granted_session) <= snap.uptime:\n',
        f'{FOUND}::test_a_cut_off_vm_does_not_serve_on_a_reading_sent_before_an_approval_made_on_its_standing_ack',
    ),
    (
        'a-cut-off-vm-waits-for-the-granted-session',
        'coordinator/snapshot.py',
        '    timeout = max(policy.session_timeout, granted or 0.0, 2 * policy.zk_tick)\n',
        '    timeout = max(policy.session_timeout, 2 * policy.zk_tick)\n',
        f'{FOUND}::test_a_vm_cut_off_after_acking_stays_out_while_a_longer_granted_session_may_hold_its_ack',
    ),
    (
        'absent-vms-see-the-event-before-it-is-approved-without-them',
        'coordinator/decide/approval.py',
        '        if left > 0:\n',
        '        if False:\n',
        # The model's replay of this break no longer reaches it: the approver now also marks the absent VMs
        # out first, a cycle later. The pure table below holds their marks already and still catches it.
        'tests/unit/test_policy.py::test_an_event_naming_vms_absent_past_the_grace_waits_for_them_to_drain_on_their_own',
    ),
    (
        'a-cut-down-view-never-admits',
        'coordinator/decide/decision.py',
        '    if snap.cluster is not None and not snap.cluster.part.holds(view_needed(snap, local, policy)):\n',
        '    if False:\n',
        'tests/unit/test_own_view.py::test_a_leader_never_admits_on_a_cut_down_view',
    ),
    (
        'a-named-view-holds-its-own-ack',
        'coordinator/store/zk_view.py',
        '            ack_names = [self._acks_of]\n',
        '            ack_names = []\n',
        'tests/integration/test_zookeeper_own_view.py::'
        'test_a_named_view_is_the_whole_view_with_the_reading_vms_own_ack_and_mark_only',
    ),
    (
        'an-agent-in-another-layout-reads-nothing',
        'coordinator/store/zk_view.py',
        '    if version != LAYOUT_VERSION:\n',
        '    if False:\n',
        'tests/integration/test_zookeeper_layout.py::test_an_agent_that_finds_another_layout_reads_nothing_and_does_not_lead',
    ),
    (
        'an-agent-in-another-layout-does-not-lead',
        'coordinator/store/zk_membership.py',
        '    if mismatch is not None:\n',
        '    if False:\n',
        'tests/integration/test_zookeeper_layout.py::test_an_agent_that_finds_another_layout_reads_nothing_and_does_not_lead',
    ),
    (
        'a-cut-down-view-weighs-no-budget',
        'coordinator/decide/approval.py',
        '            continue  # neither named by it nor leading: its approver and the leader weigh it\n',
        '            pass\n',
        'tests/unit/test_own_view.py::test_an_uninvolved_vm_on_its_own_part_publishes_nothing_and_weighs_nothing',
    ),
    (
        'an-event-never-admissible-holds-nothing-back',
        'coordinator/decide/budget.py',
        '        if alone is not None:\n',
        '        if False:\n',
        'tests/unit/test_liveness.py::test_an_event_that_no_budget_could_ever_admit_does_not_hold_back_one_that_fits',
    ),
    (
        'a-deleted-vm-holds-no-budget',
        'coordinator/decide/budget.py',
        '                                         and not _deleted(keys, cluster))}',
        '                                         and True)}',
        'tests/unit/test_liveness.py::test_a_vm_deleted_by_its_terminate_holds_no_budget',
    ),
    (
        'gone-by-the-leaders-own-documents',
        'coordinator/decide/events.py',
        '    return snap.me in record.resources or policy.delivery.covers(record, snap.seen_unnamed)\n',
        '    return False\n',
        'tests/unit/test_liveness.py::test_a_cancelled_event_frees_the_budget_when_every_agent_restarted_as_imds_dropped_it',
    ),
    (
        'gone-by-the-documents-of-a-vm-it-names',
        'coordinator/decide/events.py',
        '    return snap.me in record.resources or policy.delivery.covers(record, snap.seen_unnamed)\n',
        '    return policy.delivery.covers(record, snap.seen_unnamed)\n',
        'tests/unit/test_liveness.py::test_a_restarted_agent_that_leads_is_not_held_by_its_own_finished_event',
    ),
    (
        'own-documents-speak-only-for-events-of-its-own-unit',
        'coordinator/delivery.py',
        '        return (self.unit is not None and record.unit == self.unit and self.every_event(seen_unnamed))\n',
        '        return self.every_event(seen_unnamed)\n',
        UNITS + '::test_an_event_of_another_placement_group_is_approved_early_and_its_record_kept_while_present[unit]',
    ),
    (
        'a-record-is-closed-by-the-first-live-vm-it-names',
        'coordinator/decide/records.py',
        '        if not cluster.i_am_leader and closer != snap.me:\n',
        '        if not cluster.i_am_leader:\n',
        UNITS + '::test_an_admitted_event_cancelled_while_every_agent_restarted_frees_the_budget[untold]',
    ),
    (
        'a-record-is-closed-by-the-first-live-vm-it-names-across-units',
        'coordinator/decide/records.py',
        '        if not cluster.i_am_leader and closer != snap.me:\n',
        '        if not cluster.i_am_leader:\n',
        UNITS + '::test_an_event_of_another_placement_group_is_approved_early_and_its_record_kept_while_present[auto]',
    ),
    (
        'a-leader-that-knows-its-unit-speaks-for-its-events',
        'coordinator/decide/events.py',
        '    return snap.me in record.resources or policy.delivery.covers(record, snap.seen_unnamed)\n',
        '    return snap.me in record.resources\n',
        UNITS + '::test_a_leader_that_knows_its_unit_closes_a_cancelled_record_of_its_unit_though_no_vm_it_names_'
                'runs_an_agent',
    ),
    (
        'a-vm-deleted-by-its-terminate-holds-no-record',
        'coordinator/decide/records.py',
        '    return (record.event_type == EventType.TERMINATE and vm in record.resources'
        ' and vm not in cluster.members\n',
        '    return False and (record.event_type == EventType.TERMINATE and vm in record.resources\n',
        UNITS + '::test_a_vm_deleted_by_its_terminate_holds_nothing_where_imds_shows_each_vm_only_its_own_events',
    ),
    (
        'a-restarted-leader-takes-back-leadership-from-its-dead-predecessor',
        'coordinator/store/zk_membership.py',
        '            if stat is not None and stat.ephemeralOwner != session and membership.is_own_or_predecessor(\n',
        '            if False and stat is not None and membership.is_own_or_predecessor(\n',
        'tests/integration/test_zookeeper_store.py::test_a_restarted_agent_takes_back_leadership_from_its_previous_'
        'process_at_once',
    ),
    (
        'a-record-is-reopened-only-on-a-reading-newer-than-its-done-mark',
        'coordinator/decide/records.py',
        '            if record.done_at is not None and snap.read_sent >= snap.done_seen.get(key, float("-inf")):\n',
        '            if record.done_at is not None:\n',
        UNITS + '::test_a_record_marked_done_is_reopened_only_on_a_reading_requested_after_the_done_mark_was_seen',
    ),
    (
        'sightings-kept-while-the-store-is-unreadable',
        'coordinator/evidence.py',
        'if records is None or k in records or not is_gone(s, gone_after)}',
        'if k in (records or ()) or not is_gone(s, gone_after)}',
        'tests/unit/test_liveness.py::test_a_leader_that_could_not_read_zookeeper_as_an_event_went_still_closes_its_record',
    ),
    (
        'peer-answers-taken-as-they-come',
        'coordinator/peers.py',
        'answers = self._ask(targets, self._timeout, self._clock, self._take)',
        'answers = self._ask(targets, self._timeout, self._clock)',
        'tests/integration/test_peer_probes.py::test_a_hung_peer_holds_back_no_other_peers_answer_in_a_round',
    ),
    (
        'confirm-asks-only-the-peers-counted-serving',
        'coordinator/peers.py',
        '            serving = [vm for vm, seen in self._seen.items() if seen.in_rotation and vm in self._targets]\n',
        '            serving = list(self._targets)\n',
        'tests/integration/test_peer_probes.py::test_confirm_asks_again_only_the_peers_that_count_as_serving',
    ),
    (
        'absent-vms-marked-out-before-an-approval-without-them',
        'coordinator/decide/approval.py',
        '            if unmarked:\n',
        '            if False:\n',
        'test_a_vm_released_without_its_ack_counts_in_the_budget_until_it_is_back',
    ),
    (
        'azure-lb-updating-read-back-is-not-done',
        'coordinator/actions/azure_lb.py',
        '                if provisioning == _SUCCEEDED:\n',
        '                if provisioning in (_SUCCEEDED, "Updating"):\n',
        'tests/unit/test_azure_lb_confirm.py::test_a_write_whose_answer_was_lost_is_done_only_once_arm_says_succeeded',
    ),
    (
        'azure-lb-failed-read-back-is-written-again',
        'coordinator/actions/azure_lb.py',
        '                if provisioning == _SUCCEEDED:\n',
        '                if provisioning in (_SUCCEEDED, *_ENDED_BADLY):\n',
        'tests/unit/test_azure_lb_confirm.py::test_a_recovery_after_a_failed_write_writes_again_instead_of_taking_the_read_as_done',
    ),
    (
        'azure-lb-a-read-counts-only-after-its-own-write',
        'coordinator/actions/azure_lb.py',
        '            moved = written_against is not None and pool["etag"] != written_against\n',
        '            moved = True\n',
        'tests/unit/test_azure_lb_confirm.py::test_a_drains_write_held_on_its_way_cannot_land_after_the_recovery',
    ),
    (
        'azure-lb-a-retry-waits-for-its-own-earlier-write',
        'coordinator/actions/azure_lb.py',
        '        written_against = last[1] if last is not None and last[0] == state else None\n',
        '        written_against = None\n',
        'tests/unit/test_azure_lb_confirm.py::test_a_recovery_reading_none_while_the_pool_is_updating_waits_for_succeeded',
    ),
    (
        'azure-lb-write-without-operation-url-is-confirmed',
        'coordinator/actions/azure_lb.py',
        '            location = response.headers.get("Location")\n',
        '            return\n',
        'tests/unit/test_azure_lb_confirm.py::test_a_write_answered_without_an_operation_url_is_confirmed_by_polling',
    ),
    (
        'arm-operation-failed-or-canceled-is-an-error',
        'coordinator/azure_arm.py',
        '            if status in ("Failed", "Canceled"):\n',
        '            if False:\n',
        'tests/unit/test_azure_lb_confirm.py::test_an_operation_that_fails_is_a_fallback_for_a_drain_and_an_error_for_a_recovery',
    ),
    (
        'arm-retry-after-is-remembered-across-attempts',
        'coordinator/azure_arm.py',
        '            self._check_hold(method, url)\n',
        '            pass\n',
        'tests/unit/test_azure_lb_confirm.py::test_a_retry_after_past_the_deadline_holds_every_request_back_until_arms_time',
    ),
    (
        'apphealth-a-recovery-failing-outside-the-vm-is-no-repair',
        'coordinator/apphealth.py',
        '    if failing is not None and observed.outside_vm:\n',
        '    if False:\n',
        'tests/unit/test_apphealth.py::test_a_recovery_failing_outside_this_vm_stays_healthy_and_the_kinds_are_timed_apart',
    ),
    (
        'hand-drain-admitted-holds-its-slot-before-the-vm-is-out',
        'coordinator/decide/budget.py',
        '        if drain.admitted_at is not None and (vm in cluster.members\n',
        '        if False and (vm in cluster.members\n',
        'tests/unit/test_hand_drain.py::test_an_admitted_drain_holds_its_slot_before_its_vm_is_out',
    ),
    (
        'hand-drain-holds-without-a-view',
        'coordinator/decide/drain.py',
        '        return BY_HAND in local.draining_for\n',
        '        return False\n',
        'tests/unit/test_hand_drain.py::test_without_a_view_a_vm_drained_by_hand_stays_out',
    ),
    (
        'hand-drain-unreadable-state-file-holds-it',
        'coordinator/agent.py',
        '            draining_for=held | {BY_HAND} if state_file.unreadable else held,\n',
        '            draining_for=held,\n',
        'tests/unit/test_hand_drain_agent.py::test_an_unreadable_state_file_holds_a_drain_by_hand_until_a_view_says_there_is_none',
    ),
    (
        'hand-drain-an-old-admission-admits-no-new-drain',
        'coordinator/store/zk_drains.py',
        '            if admission is not None and drain is not None and admission.drain == drain.asked:\n',
        '            if admission is not None and drain is not None:\n',
        'tests/integration/test_store_contract.py::test_a_drain_by_hand_is_admitted_once_and_an_undone_ones_admission_admits_no_later_drain',
    ),
    (
        'vouch-stands-only-for-a-vm-without-an-agent',
        'coordinator/decide/events.py',
        '    if vm in cluster.members:\n        return True\n    if record is not None and record.done_at is None and '
        'record.vouched is not None and vm in record.vouched.vms:\n        return False\n',
        '    if record is not None and record.done_at is None and record.vouched is not None and vm in '
        'record.vouched.vms:\n        return False\n    if vm in cluster.members:\n        return True\n',
        'tests/unit/test_vouched.py::test_a_word_for_a_vm_that_runs_an_agent_again_does_not_stand_for_its_ack',
    ),
    (
        'vouch-cleared-by-the-done-mark',
        'coordinator/store/zk_records.py',
        '**history, done_at=done_at,\n                                                      vouched=None)',
        '**history, done_at=done_at)',
        'tests/integration/test_store_contract.py::test_an_operators_word_is_written_once_into_the_open_record_and_the_approval_keeps_it',
    ),
    (
        'gate-admission-from-the-records-copy-only-while-it-holds',
        'coordinator/store/zk_gate.py',
        '            if admission and node.mirrors(record_stat):\n',
        '            if admission:\n',
        'tests/integration/test_zookeeper_store.py::'
        'test_the_gate_reads_the_admission_from_the_record_while_its_copy_holds_and_else_from_the_child',
    ),
    (
        'leader-reads-every-ack-in-the-leader-approver-mode',
        'coordinator/decide/decision.py',
        '    if cluster.i_am_leader and (policy.approver is ApproverMode.LEADER\n',
        '    if cluster.i_am_leader and (False\n',
        'tests/unit/test_own_view.py::test_a_leader_in_the_leader_approver_mode_follows_the_whole_group',
    ),
    (
        'leader-reads-every-ack-for-a-record-no-agent-is-named-by',
        'coordinator/decide/decision.py',
        '            if first == me or first is None:\n',
        '            if first == me:\n',
        'tests/unit/test_own_view.py::test_how_much_of_the_group_each_vm_follows',
    ),
    (
        'archive-only-what-no-counted-vm-is-out-for',
        'coordinator/decide/records.py',
        '        if record.done_at is None or key in held or any(counted(vm) for vm in record.acks):\n',
        '        if record.done_at is None:\n',
        'tests/unit/test_archive.py::test_which_records_the_leader_moves_to_the_history',
    ),
    (
        'archive-waits-the-grace-when-no-agent-is-named',
        'coordinator/decide/records.py',
        '        after = policy.archive_after if first_live(record.resources, cluster) is not None '
        'else policy.recovery_grace\n',
        '        after = policy.archive_after\n',
        'tests/unit/test_archive.py::test_which_records_the_leader_moves_to_the_history',
    ),
    (
        'an-approval-waits-for-its-peers-asked-again',
        'coordinator/decide/approval.py',
        '    if snap.peers_confirmed_at is not None and snap.peers_confirmed_at >= snap.cycle_started:\n',
        '    if True:\n',
        'test_an_approval_asks_the_peers_again_instead_of_trusting_the_last_round',
    ),
    (
        'a-failed-store-operation-stops-the-rest',
        'coordinator/execute.py',
        '        if op.in_store and store_failed:\n',
        '        if False:\n',
        'tests/unit/test_operations.py::test_a_failed_store_operation_stops_the_store_operations_after_it_and_nothing_else',
    ),
    (
        'out-mark-before-the-ack',
        'coordinator/decide/order.py',
        '        if plan.mark_out is not None:\n            ops.append(MarkOut(plan.mark_out, now))\n'
        '        ops.extend(PublishEvent(record) for record in plan.publish)\n'
        '        ops.extend(Reopen(key) for key in plan.reopen)\n'
        '        ops.extend(Admit(key, now) for key in plan.admit)\n'
        '        ops.extend(AdmitDrain(vm, asked, now) for vm, asked in sorted(plan.admit_drains.items()))\n'
        '        ops.extend(ForgetAdmission(vm) for vm in plan.forget_admissions)\n'
        '        drain_started = plan.local.drain_started\n'
        '        ops.extend(Acknowledge(key, now, drain_started, snap.mono - drain_started) for key in plan.ack)\n',
        '        ops.extend(PublishEvent(record) for record in plan.publish)\n'
        '        ops.extend(Reopen(key) for key in plan.reopen)\n'
        '        ops.extend(Admit(key, now) for key in plan.admit)\n'
        '        ops.extend(AdmitDrain(vm, asked, now) for vm, asked in sorted(plan.admit_drains.items()))\n'
        '        ops.extend(ForgetAdmission(vm) for vm in plan.forget_admissions)\n'
        '        drain_started = plan.local.drain_started\n'
        '        ops.extend(Acknowledge(key, now, drain_started, snap.mono - drain_started) for key in plan.ack)\n'
        '        if plan.mark_out is not None:\n            ops.append(MarkOut(plan.mark_out, now))\n',
        'tests/unit/test_operations.py::test_the_operations_come_in_the_order_safety_rests_on',
    ),
]


def _copy(work: Path) -> None:
    shutil.copytree(ROOT / "coordinator", work / "coordinator")
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__", "e2e"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")


def _check(work: Path, mutation: tuple[str, str, str, str, str]) -> tuple[bool, str]:
    """Undo one fix in the copy at ``work``, run its test, put the fix back: (caught, the line to print)."""
    name, path, fixed, unfixed, test = mutation
    target = work / path
    original = target.read_text()
    if fixed not in original:
        return False, f"{name}: the code of the fix is no longer in {path}; update this list"
    target.write_text(original.replace(fixed, unfixed, 1))
    try:
        # A test is named alone (in TESTS) or by its node id (path::name).
        selection = [test] if "::" in test else [TESTS, "-k", test]
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *selection],
                             cwd=work, capture_output=True, text=True, timeout=300)
    finally:
        target.write_text(original)
    caught = run.returncode == 1
    return caught, f"{'ok  ' if caught else 'MISS'} {name}: {test} {'fails' if caught else 'passes'} without the fix"


def main(names: list[str]) -> int:
    selected = [m for m in MUTATIONS if not names or any(n in m[0] for n in names)]
    if not selected:
        print(f"no fix is named like {' or '.join(names)}")
        return 1
    # Two copies checked side by side (REGRESSION_WORKERS): most of a check is waiting on a test's servers.
    workers = max(1, min(int(os.environ.get("REGRESSION_WORKERS", "2")), len(selected)))
    pending: queue.Queue[tuple[str, str, str, str, str]] = queue.Queue()
    for mutation in selected:
        pending.put(mutation)
    failures = 0
    lock = threading.Lock()

    def worker(work: Path) -> None:
        nonlocal failures
        _copy(work)
        while True:
            try:
                mutation = pending.get_nowait()
            except queue.Empty:
                return
            caught, line = _check(work, mutation)
            with lock:
                failures += not caught
                print(line, flush=True)

    with tempfile.TemporaryDirectory(prefix="regressions-") as tmp:
        threads = [threading.Thread(target=worker, args=(Path(tmp) / str(n),)) for n in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(f"{len(selected) - failures} of {len(selected)} fixes caught by their tests when undone", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
