/**
 * The status dialog's answers to what a user asks, in plain words: where their code runs and since
 * when, whether their cells are recorded and where, the worker's memory and how to limit it, what
 * happens if the worker dies, and the deadlines. Made from the kernel's state (its `facts` and
 * `memory`, docs/comm-protocol.md); no DOM here: `status.ts` draws the rows, the operator's
 * `status` rows after them in a collapsed Details.
 */

import { clock, IGeneration } from './generations';
import { IMemory, sizeText } from './logic';
import { IFacts, IKernelState } from './messages';

/** Seconds in words: "45 s", "5 min", "2 h 05 min". */
export function durationText(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 120) {
    return `${s} s`;
  }
  const minutes = Math.round(s / 60); // rounded first: 7190 s is 2 h 00 min, not 120 min
  if (minutes < 120) {
    return `${minutes} min`;
  }
  return `${Math.floor(minutes / 60)} h ${String(minutes % 60).padStart(2, '0')} min`;
}

function runsWhere(state: IKernelState, facts: IFacts, now: number): string {
  if (state.generation === null) {
    return `nowhere at the moment (${facts.state}): no worker serves this notebook`;
  }
  const host = facts.host !== null ? ` (${facts.host})` : '';
  const where = state.placement === 'local' ? `on this machine${host}` : `on ${state.placement}${host}`;
  const started = facts.since !== null ? Date.parse(facts.since) : NaN;
  const since = Number.isNaN(started) ? '' : `, since ${clock(facts.since ?? '')} (${durationText((now - started) / 1000)} ago)`;
  return `${where}, in generation ${state.generation}${since}`;
}

function recorded(state: IKernelState, facts: IFacts): string {
  const why = facts.cell_log_problem !== null ? ` (${facts.cell_log_problem})` : '';
  if (state.recording === 'recording') {
    const session = state.store_session !== null ? `, session ${state.store_session}` : '';
    return `yes, every cell and its outputs, in ${facts.cell_log}${session}`;
  }
  if (state.recording === 'paused') {
    return `PAUSED: the cell log cannot be written, so cells are refused until it can${why}`;
  }
  return `no: the cell log could not be opened${why}; nothing of this session is kept`;
}

const SET_LIMIT = '%klbr memory LIMIT (e.g. 4G) sets the next generation\u2019s';

function memoryWords(memory: IMemory | null | undefined, facts: IFacts): string {
  const next = facts.memory_limit_next;
  const measured = memory ? `${sizeText(memory.rss)} now, ${sizeText(memory.peak)} at most so far` : 'not measured (a worker elsewhere, or none yet)';
  let limit: string;
  if (memory?.limit) {
    limit = `limit ${sizeText(memory.limit)}: past it, code gets a MemoryError`;
    if (next !== memory.limit) {
      limit += next ? `; the next generation\u2019s: ${sizeText(next)}` : '; the next generation has none';
    }
  } else if (next && facts.memory_limit_applies === false) {
    limit = `limit ${sizeText(next)} set, but this placement does not apply one`;
  } else if (next) {
    limit = memory ? `no limit now; the next generation\u2019s: ${sizeText(next)}` : `limit ${sizeText(next)}`;
  } else {
    limit = 'no limit';
  }
  return `${measured}; ${limit}. ${SET_LIMIT}.`;
}

function ifItDies(facts: IFacts): string {
  const window = durationText(facts.restart_window);
  if (facts.state === 'stopped: crash loop') {
    return (
      `no new generation starts: klbr started ${facts.restarts} for workers that ended in the last ${window}, and stopped ` +
      'rather than loop. Fix the cause, then %klbr restart (and %klbr rebuild to run the recorded cells again).'
    );
  }
  if (facts.state === 'stopped: link lost') {
    return 'no new generation starts while the lost worker elsewhere may still run: %klbr reconnect starts one on the same placement.';
  }
  const budget =
    `${facts.restarts} of ${facts.restart_limit} automatic restarts used in the last ${window}; ` +
    'past that, klbr stops and waits for %klbr restart';
  return (
    'the next cell runs in a new generation: variables and imports are lost, the recorded cells and their outputs ' +
    `are kept (%klbr rebuild runs them again). ${budget}.`
  );
}

function deadlines(facts: IFacts): string {
  const grace = durationText(facts.interrupt_grace);
  const timeout =
    facts.cell_timeout !== null
      ? `a cell still running after ${durationText(facts.cell_timeout)} is interrupted, its namespace kept`
      : 'a cell may run as long as it needs';
  return `${timeout}; a cell that ignores an interrupt (\u25a0) for ${grace} has its worker ended, and the namespace with it.`;
}

/** The dialog's leading rows, [question, answer]; none from a kernel that sends no `facts`. */
export function userRows(state: IKernelState, now: number): Array<[string, string]> {
  const facts = state.facts;
  if (!facts) {
    return [];
  }
  return [
    ['Your code runs', runsWhere(state, facts, now)],
    ['Cells recorded', recorded(state, facts)],
    ['Memory', memoryWords(state.memory, facts)],
    ['If the worker dies', ifItDies(facts)],
    ['Deadlines', deadlines(facts)]
  ];
}

/** `%klbr status`'s rows as its text: the dialog's Details. */
export function statusTable(rows: Array<[string, string]>): string {
  const width = Math.max(0, ...rows.map(([key]) => key.length));
  return rows.map(([key, value]) => `${key.padEnd(width)}  ${value}`).join('\n');
}

/** The generations to draw, the serving one's peak taken from the state when the kernel sent none (an older kernel). */
export function withServingPeak(generations: IGeneration[], state: IKernelState): IGeneration[] {
  const peak = state.memory?.peak;
  return generations.map(g =>
    g.ended === null && g.number === state.generation && g.memory_peak === null && peak ? { ...g, memory_peak: peak } : g
  );
}
