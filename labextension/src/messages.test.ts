import { describe, expect, it } from 'vitest';

import { isCellsChunk, isEndedPush, isKernelState, isOutputPush, refusal } from './messages';

/** A `hello` answer as klbr_kernel/comm.py sends it. */
function helloAnswer(fields: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    v: 1,
    id: 'hello-1',
    op: 'hello',
    protocol: 1,
    implementation: 'klbr',
    version: '0.1.0',
    kernel_session: 'abc',
    store_session: 3,
    generation: 1,
    placement: 'local',
    recording: 'recording',
    notebook: 'tour.ipynb',
    status: [
      ['generation', '1'],
      ['cell log', '/tmp/klbr.db']
    ],
    memory: { rss: 2 ** 28, peak: 2 ** 29, limit: null },
    ...fields
  };
}

const part = {
  cell_id: 'a',
  record_id: 1,
  msg_id: 'm1',
  session: 3,
  execution_count: 1,
  status: 'ok',
  running: false,
  code: 'print(1)',
  outputs_truncated: false,
  part: 0,
  complete: true,
  outputs: [{ output_type: 'stream', name: 'stdout', text: '1\n' }]
};

describe('the kernel state', () => {
  it('is what hello, state and restart carry, with or without a memory sample', () => {
    expect(isKernelState(helloAnswer())).toBe(true);
    expect(isKernelState(helloAnswer({ memory: null, generation: null, notebook: null, store_session: null }))).toBe(true);
    const { memory: _memory, ...older } = helloAnswer();
    expect(isKernelState(older)).toBe(true);
  });

  it('is refused with a field missing or of the wrong type', () => {
    const { placement: _placement, ...noPlacement } = helloAnswer();
    expect(isKernelState(noPlacement)).toBe(false);
    expect(isKernelState(helloAnswer({ recording: 'maybe' }))).toBe(false);
    expect(isKernelState(helloAnswer({ status: [['generation']] }))).toBe(false);
    expect(isKernelState(helloAnswer({ memory: { rss: '1 MiB' } }))).toBe(false);
    expect(isKernelState([helloAnswer()])).toBe(false);
  });
});

describe('a cells chunk', () => {
  const chunk = { v: 1, id: 'cells-1', op: 'cells', chunk: 0, last: true, cells: [part], session: 3, unmatched: [], queued: [], following: [] };

  it('is what the kernel sends, the last one with its lists', () => {
    expect(isCellsChunk(chunk)).toBe(true);
    const { session: _s, unmatched: _u, queued: _q, following: _f, ...middle } = chunk;
    expect(isCellsChunk({ ...middle, last: false })).toBe(true);
  });

  it('is refused when a part or a list is not what the protocol says', () => {
    expect(isCellsChunk({ ...chunk, cells: [{ ...part, record_id: '1' }] })).toBe(false);
    expect(isCellsChunk({ ...chunk, cells: [{ ...part, outputs: [{ text: 'no type' }] }] })).toBe(false);
    expect(isCellsChunk({ ...chunk, queued: [{ cell_id: 'b', msg_id: 'm2' }] })).toBe(false);
    expect(isCellsChunk({ ...chunk, following: [1] })).toBe(false);
    expect(isCellsChunk({ ...chunk, op: 'hello' })).toBe(false);
  });
});

describe('pushes and refusals', () => {
  it('checks an output push and an ended push', () => {
    expect(isOutputPush({ v: 1, op: 'output', msg_id: 'm1', record_id: null, msg_type: 'stream', content: { name: 'stdout', text: 'x' } })).toBe(true);
    expect(isOutputPush({ v: 1, op: 'output', msg_id: 'm1', msg_type: 'stream' })).toBe(false);
    expect(isEndedPush({ v: 1, op: 'ended', msg_id: 'm1', record_id: 4, status: 'ok', execution_count: 3 })).toBe(true);
    expect(isEndedPush({ v: 1, op: 'ended', msg_id: 'm1', execution_count: '3' })).toBe(false);
  });

  it('reads a refusal, names a malformed one, and finds none in an answer', () => {
    expect(refusal({ v: 1, id: 'x', error: { name: 'UnknownOp', message: 'no op nope' } })).toEqual({ name: 'UnknownOp', message: 'no op nope' });
    expect(refusal({ v: 1, id: 'x', error: 'bad' })).toEqual({ name: 'MalformedAnswer', message: 'an error without a name and a message' });
    expect(refusal({ v: 1, id: 'x', op: 'unfollow', msg_id: 'm' })).toBeNull();
  });
});
