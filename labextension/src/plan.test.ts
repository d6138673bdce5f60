import { describe, expect, it } from 'vitest';

import { GenerationWatch, IPlanAnswer, about, announcement, earlierCells, isPlanAnswer, noRebuild, offerLabel, offerOnChange, rebuildable, stopped } from './plan';

/** A `plan` answer as klbr_kernel/comm/plan.py sends it, after generation 1 was lost. */
function answer(fields: Partial<IPlanAnswer> = {}, plan: Record<string, unknown> = {}): IPlanAnswer {
  return {
    current: 2,
    generations: { a: 1, b: 1, c: 2 },
    plan: {
      generation: 1,
      end_reason: 'lost: killed by signal 9 (SIGKILL)',
      asked: false,
      rebuilt: false,
      cells: 14,
      skipped: 1,
      seconds: 185,
      text: 'Generation 1 ... was built by 14 cells',
      ...plan
    },
    ...fields
  };
}

describe('the plan answer', () => {
  it('is read only when it is what the protocol says', () => {
    expect(isPlanAnswer({ v: 1, id: 1, op: 'plan', ...answer() })).toBe(true);
    expect(isPlanAnswer({ ...answer(), plan: null })).toBe(true);
    expect(isPlanAnswer({ ...answer(), generations: { a: '1' } })).toBe(false);
    expect(isPlanAnswer({ ...answer(), plan: { generation: 1 } })).toBe(false);
    expect(isPlanAnswer({ current: '2', generations: {}, plan: null })).toBe(false);
    expect(isPlanAnswer(null)).toBe(false);
    expect(isPlanAnswer({ ...answer(), refusal: { ename: 'CrashLoop', evalue: 'x' } })).toBe(true);
    expect(isPlanAnswer({ ...answer(), refusal: null })).toBe(true);
    expect(isPlanAnswer({ ...answer(), refusal: { ename: 'CrashLoop' } })).toBe(false);
  });
});

describe('the offer', () => {
  it('says how many cells and about how long', () => {
    expect(offerLabel(answer().plan!)).toBe('Rebuild the namespace (14 cells, about 3 min)');
    expect(offerLabel({ ...answer().plan!, cells: 1, seconds: 0.01 })).toBe('Rebuild the namespace (1 cell, under a second)');
    expect([about(12.4), about(5400)]).toEqual(['about 12 s', 'about 1.5 h']);
  });

  it('pops up for a generation that ended unasked, with cells to run', () => {
    expect(offerOnChange(answer())?.generation).toBe(1);
    expect(offerOnChange(answer({}, { asked: true }))).toBeNull(); // a restart the user asked for
    expect(rebuildable(answer({}, { asked: true }))?.generation).toBe(1); // the status item still offers it
    expect(offerOnChange(answer({}, { cells: 0 }))).toBeNull();
    expect(rebuildable(answer({}, { rebuilt: true }))).toBeNull(); // done already: offered no more
    expect(offerOnChange(answer({ plan: null }))).toBeNull();
  });

  it('announces every change, of its notebook, how the old generation ended included', () => {
    expect(announcement({ from: 1, to: 2 }, answer(), 'a.ipynb')).toBe(
      'klbr, a.ipynb: generation 1 ended (lost: killed by signal 9 (SIGKILL)); generation 2 starts with an empty namespace.'
    );
    expect(announcement({ from: 1, to: 3 }, answer({ plan: null }), 'a.ipynb')).toBe(
      'klbr, a.ipynb: generation 1 ended; generation 3 starts with an empty namespace.'
    );
  });

  it('offers nothing while klbr starts no generation, and says so once none serves', () => {
    const evalue =
      'Nothing ran: the worker was lost 2 times within 300 s, so klbr stopped starting new ones rather than loop. Fix the ' +
      'cause, then run `%klbr restart` to start a fresh generation.\n2 automatic new generations within 300 s reached ...';
    const loop = answer({ current: null, refusal: { ename: 'CrashLoop', evalue } }, { generation: 3 });
    expect(rebuildable(loop)).toBeNull(); // a rebuild would be refused: no offer, no "rebuild?"
    expect(offerOnChange(loop)).toBeNull();
    expect(stopped(loop, 'a.ipynb')).toBe(
      'klbr, a.ipynb: generation 3 ended (lost: killed by signal 9 (SIGKILL)), and no new generation starts (CrashLoop): the ' +
        'worker was lost 2 times within 300 s, so klbr stopped starting new ones rather than loop. Fix the cause, then run ' +
        '`%klbr restart` to start a fresh generation.'
    );
    expect(stopped(answer({ current: null }), 'a.ipynb')).toBeNull(); // none yet, one starts when needed
    expect(stopped(answer({ refusal: null }), 'a.ipynb')).toBeNull();
    // the plan dialog, asked meanwhile, says why not and what to do
    expect(noRebuild(loop, 'a.ipynb')).toBe(
      'klbr, a.ipynb: no rebuild now (CrashLoop): the worker was lost 2 times within 300 s, so klbr stopped starting new ' +
        'ones rather than loop. Fix the cause, then run `%klbr restart` to start a fresh generation.'
    );
    expect(noRebuild(answer({ refusal: null }), 'a.ipynb')).toBe('klbr, a.ipynb: there is nothing to rebuild');
    expect(noRebuild(null, 'a.ipynb')).toBe('klbr, a.ipynb: there is nothing to rebuild');
  });
});

describe('generation changes', () => {
  it('are seen once, a missing generation in between changes nothing, another kernel starts afresh', () => {
    const watch = new GenerationWatch();
    expect(watch.seen(1)).toBeNull();
    expect(watch.seen(1)).toBeNull();
    expect(watch.seen(null)).toBeNull();
    expect(watch.seen(3)).toEqual({ from: 1, to: 3 });
    expect(watch.seen(3)).toBeNull();
    watch.reset();
    expect(watch.seen(1)).toBeNull();
  });
});

describe('earlier-generation cells', () => {
  it('are those whose results were made in a generation that no longer serves', () => {
    expect([...earlierCells(answer()).entries()]).toEqual([
      ['a', 1],
      ['b', 1]
    ]);
    expect(earlierCells(answer({ current: null })).size).toBe(0);
  });
});
