import { describe, expect, it } from 'vitest';

import { endWords, IGeneration, isGenerations } from './generations';

const generation = (ended: string | null, reason: string | null): IGeneration => ({
  number: 2,
  placement: 'local',
  started: '2026-12-06T10:00:00.000Z',
  ended,
  end_reason: reason,
  memory_peak: null,
  cells: 3
});

describe('the generations picture', () => {
  it('says how each ended in a user\u2019s words, the detail after', () => {
    expect(endWords(generation(null, null))).toBe('serving now');
    expect(endWords(generation('2026-12-06T10:05:00.000Z', 'lost: killed by signal 9 (SIGKILL)'))).toMatch(
      /^its worker died \(killed by signal 9 \(SIGKILL\)\) at /
    );
    expect(endWords(generation('2026-12-06T10:05:00.000Z', 'restart'))).toMatch(/^restarted at /);
  });

  it('takes only rows it can draw', () => {
    expect(isGenerations([generation(null, null)])).toBe(true);
    expect(isGenerations([{ number: '1' }])).toBe(false);
    expect(isGenerations(null)).toBe(false);
  });
});
