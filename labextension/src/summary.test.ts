import { describe, expect, it } from 'vitest';

import { IGeneration } from './generations';
import { IFacts, IKernelState, isKernelState } from './messages';
import { durationText, statusTable, userRows, withServingPeak } from './summary';

const MiB = 2 ** 20;
const STARTED = '2026-12-06T10:00:00.000Z';

const facts = (fields: Partial<IFacts> = {}): IFacts => ({
  state: 'ready',
  since: STARTED,
  host: 'vm',
  cell_log: '/home/u/.local/share/klbr/log.sqlite3',
  cell_log_problem: null,
  restarts: 1,
  restart_limit: 5,
  restart_window: 300,
  cell_timeout: null,
  interrupt_grace: 3,
  memory_limit_next: null,
  memory_limit_applies: true,
  ...fields
});

const state = (fields: Partial<IKernelState> = {}): IKernelState => ({
  generation: 2,
  placement: 'local',
  recording: 'recording',
  notebook: '/home/u/tour.ipynb',
  kernel_session: 'abc',
  store_session: 7,
  status: [
    ['generation', '2'],
    ['pid', '2201'],
    ['key', 'shared with the frontend']
  ],
  memory: { rss: 50 * MiB, peak: 250 * MiB, limit: null },
  facts: facts(),
  ...fields
});

const FIVE_MINUTES_LATER = Date.parse(STARTED) + 300_000;

function answers(s: IKernelState): Record<string, string> {
  return Object.fromEntries(userRows(s, FIVE_MINUTES_LATER));
}

describe('the status dialog in a user\u2019s words', () => {
  it('leads with where the code runs and since when, and whether cells are recorded where', () => {
    const rows = userRows(state(), FIVE_MINUTES_LATER);
    expect(rows.map(([question]) => question)).toEqual([
      'Your code runs',
      'Cells recorded',
      'Memory',
      'If the worker dies',
      'Deadlines'
    ]);
    const said = answers(state());
    expect(said['Your code runs']).toMatch(/^on this machine \(vm\), in generation 2, since .+ \(5 min ago\)$/);
    expect(said['Cells recorded']).toBe(
      'yes, every cell and its outputs, in /home/u/.local/share/klbr/log.sqlite3, session 7'
    );
    const elsewhere = answers(state({ placement: 'ssh://gpu1', facts: facts({ host: 'gpu1.lan' }) }));
    expect(elsewhere['Your code runs']).toMatch(/^on ssh:\/\/gpu1 \(gpu1\.lan\), in generation 2/);
    const none = answers(state({ generation: null, facts: facts({ state: 'stopped: crash loop', since: null }) }));
    expect(none['Your code runs']).toBe('nowhere at the moment (stopped: crash loop): no worker serves this notebook');
  });

  it('says why cells are not recorded', () => {
    const paused = answers(state({ recording: 'paused', facts: facts({ cell_log_problem: 'disk full' }) }));
    expect(paused['Cells recorded']).toBe('PAUSED: the cell log cannot be written, so cells are refused until it can (disk full)');
    const off = answers(state({ recording: 'unavailable', facts: facts({ cell_log_problem: 'read-only' }) }));
    expect(off['Cells recorded']).toMatch(/^no: the cell log could not be opened \(read-only\)/);
  });

  it('gives memory now, peak and limit, and how to set one', () => {
    expect(answers(state()).Memory).toBe(
      '50 MiB now, 250 MiB at most so far; no limit. %klbr memory LIMIT (e.g. 4G) sets the next generation\u2019s.'
    );
    const limited = state({ memory: { rss: 50 * MiB, peak: 60 * MiB, limit: 2 ** 31 }, facts: facts({ memory_limit_next: 2 ** 31 }) });
    expect(answers(limited).Memory).toMatch(/^50 MiB now, 60 MiB at most so far; limit 2\.0 GiB: past it, code gets a MemoryError\. /);
    const changed = state({ facts: facts({ memory_limit_next: 2 ** 32 }) });
    expect(answers(changed).Memory).toMatch(/; no limit now; the next generation\u2019s: 4\.0 GiB\. /);
    const ignored = state({ memory: null, placement: 'docker://img', facts: facts({ memory_limit_next: 2 ** 32, memory_limit_applies: false }) });
    expect(answers(ignored).Memory).toMatch(/^not measured .*; limit 4\.0 GiB set, but this placement does not apply one\. /);
  });

  it('says what a worker\u2019s death does, the restarts used of the limit, and the deadlines', () => {
    const said = answers(state());
    expect(said['If the worker dies']).toMatch(/^the next cell runs in a new generation: variables and imports are lost/);
    expect(said['If the worker dies']).toContain('1 of 5 automatic restarts used in the last 5 min');
    expect(said.Deadlines).toBe(
      'a cell may run as long as it needs; a cell that ignores an interrupt (\u25a0) for 3 s has its worker ended, and the namespace with it.'
    );
    const timed = answers(state({ facts: facts({ cell_timeout: 3600, interrupt_grace: 10 }) }));
    expect(timed.Deadlines).toMatch(/^a cell still running after 60 min is interrupted, its namespace kept; .* for 10 s /);
  });

  it('in a crash loop or with the link lost, promises no new generation', () => {
    const loop = answers(state({ generation: null, facts: facts({ state: 'stopped: crash loop', restarts: 5 }) }));
    expect(loop['If the worker dies']).toMatch(/^no new generation starts: klbr started 5 for workers that ended in the last 5 min/);
    expect(loop['If the worker dies']).toContain('then %klbr restart');
    const lost = answers(state({ generation: null, facts: facts({ state: 'stopped: link lost' }) }));
    expect(lost['If the worker dies']).toMatch(/^no new generation starts .*%klbr reconnect/);
  });

  it('from a kernel that sends no facts, has no rows (the dialog shows the status table open)', () => {
    const older = state({ facts: undefined });
    expect(userRows(older, FIVE_MINUTES_LATER)).toEqual([]);
    expect(isKernelState(older)).toBe(true);
    expect(isKernelState(state({ facts: { ...facts(), restarts: 'one' } as unknown as IFacts }))).toBe(false);
  });

  it('keeps %klbr status\u2019s rows for Details, aligned', () => {
    expect(statusTable(state().status)).toBe('generation  2\npid         2201\nkey         shared with the frontend');
  });

  it('words durations', () => {
    expect([durationText(3), durationText(119.6), durationText(300), durationText(7190), durationText(7500)]).toEqual([
      '3 s',
      '2 min',
      '5 min',
      '2 h 00 min',
      '2 h 05 min'
    ]);
  });
});

describe('the generations picture', () => {
  const serving: IGeneration = { number: 2, placement: 'local', started: STARTED, ended: null, end_reason: null, memory_peak: null, cells: 1 };
  const ended: IGeneration = { ...serving, number: 1, ended: STARTED, end_reason: 'lost: killed by signal 9', memory_peak: 300 * MiB };

  it('gives the serving generation the state\u2019s peak when an older kernel sent none, and leaves the rest', () => {
    const drawn = withServingPeak([ended, serving], state());
    expect(drawn.map(g => g.memory_peak)).toEqual([300 * MiB, 250 * MiB]);
    expect(withServingPeak([{ ...serving, memory_peak: 400 * MiB }], state())[0].memory_peak).toBe(400 * MiB);
    expect(withServingPeak([serving], state({ memory: null }))[0].memory_peak).toBeNull();
  });
});
