import type { JSONObject } from '@lumino/coreutils';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import { ICommPort, IPushHandler, KlbrComm, KlbrError } from './comm';
import { ChunkError, IAnswer } from './logic';
import { IEndedPush, IKernelState, IOutputPush } from './messages';

/** The comm a `KlbrComm` speaks on: what it sent, and how often it was closed. */
class Port implements ICommPort {
  sent: JSONObject[] = [];
  closes = 0;
  isDisposed = false;
  failClose = false;

  send(data: JSONObject): void {
    this.sent.push(data);
  }

  close(): void {
    this.closes += 1;
    if (this.failClose) {
      throw new Error('the kernel connection is gone');
    }
  }

  /** The id of the last request sent. */
  get lastId(): string {
    const id = this.sent[this.sent.length - 1]?.id;
    if (typeof id !== 'string') {
      throw new Error('no request was sent');
    }
    return id;
  }
}

/** Everything pushed, in order (with the answers the test records between them). */
class Pushes implements IPushHandler {
  seen: string[] = [];
  states: IKernelState[] = [];

  state(state: IKernelState): void {
    this.seen.push(`state ${state.generation}`);
    this.states.push(state);
  }

  output(push: IOutputPush): void {
    this.seen.push(`output ${push.msg_id}`);
  }

  ended(push: IEndedPush): void {
    this.seen.push(`ended ${push.msg_id} ${push.execution_count}`);
  }
}

const state = { generation: 2, placement: 'local', recording: 'recording', notebook: null, kernel_session: 's', store_session: 1, status: [] };

function part(recordId: number, n: number, complete: boolean, text: string): JSONObject {
  return {
    cell_id: `c${recordId}`,
    record_id: recordId,
    msg_id: `m${recordId}`,
    session: 1,
    execution_count: recordId,
    status: 'ok',
    running: false,
    code: 'x',
    outputs_truncated: false,
    part: n,
    complete,
    outputs: [{ output_type: 'stream', name: 'stdout', text }]
  };
}

describe('KlbrComm', () => {
  let port: Port;
  let pushes: Pushes;
  let comm: KlbrComm;

  beforeEach(() => {
    port = new Port();
    pushes = new Pushes();
    comm = new KlbrComm(port, pushes);
    vi.spyOn(console, 'warn').mockImplementation(() => undefined);
  });

  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('sends a request with an id of its own and resolves it with the answer that repeats that id', async () => {
    const first = comm.request('unfollow', { msg_id: 'm1' });
    const firstId = port.lastId;
    const second = comm.request('hello');
    expect(port.sent).toEqual([
      { v: 1, id: firstId, op: 'unfollow', msg_id: 'm1' },
      { v: 1, id: port.lastId, op: 'hello' }
    ]);
    expect(port.lastId).not.toBe(firstId);
    comm.receive({ v: 1, id: port.lastId, op: 'hello', ...state });
    comm.receive({ v: 1, id: firstId, op: 'unfollow', msg_id: 'm1' });
    await expect(second).resolves.toMatchObject({ op: 'hello', generation: 2 });
    await expect(first).resolves.toEqual({ v: 1, id: firstId, op: 'unfollow', msg_id: 'm1' });
  });

  it('rejects a refused request with the protocol error name, and only that request', async () => {
    const refused = comm.request('nope');
    const refusedId = port.lastId;
    const other = comm.request('hello');
    comm.receive({ v: 1, id: refusedId, error: { name: 'UnknownOp', message: 'no op nope' } });
    await expect(refused).rejects.toThrow(new KlbrError('UnknownOp', 'no op nope'));
    await expect(refused).rejects.toHaveProperty('name', 'UnknownOp');
    comm.receive({ v: 1, id: port.lastId, op: 'hello', ...state });
    await expect(other).resolves.toMatchObject({ generation: 2 });
  });

  it('assembles a cells answer from its chunks and runs onAnswer before the push that follows it', async () => {
    const answered: IAnswer[] = [];
    const answer = comm.cells({ cell_ids: ['c1'], follow: true }, a => {
      answered.push(a);
      pushes.seen.push('answer');
    });
    const id = port.lastId;
    expect(port.sent[0]).toEqual({ v: 1, id, op: 'cells', cell_ids: ['c1'], follow: true });
    comm.receive({ v: 1, id, op: 'cells', chunk: 0, last: false, cells: [part(1, 0, false, 'ab')] });
    expect(answered).toEqual([]);
    comm.receive({ v: 1, id, op: 'cells', chunk: 1, last: true, cells: [part(1, 1, true, 'cd')], session: 1, following: ['m1'] });
    comm.receive({ v: 1, op: 'output', msg_id: 'm1', record_id: 1, msg_type: 'stream', content: { name: 'stdout', text: 'e' } });
    expect(pushes.seen).toEqual(['answer', 'output m1']);
    const done = await answer;
    expect(done.records[0].outputs).toEqual([{ output_type: 'stream', name: 'stdout', text: 'abcd' }]);
    expect(done.following).toEqual(['m1']);
    expect(answered).toEqual([done]);
  });

  it('rejects a cells answer whose chunk is malformed or out of order', async () => {
    const malformed = comm.cells({ cell_ids: [] });
    comm.receive({ v: 1, id: port.lastId, op: 'cells', chunk: 0, last: true, cells: [{ record_id: 1 }] });
    await expect(malformed).rejects.toHaveProperty('name', 'MalformedAnswer');
    const skipped = comm.cells({ cell_ids: [] });
    comm.receive({ v: 1, id: port.lastId, op: 'cells', chunk: 1, last: true, cells: [] });
    await expect(skipped).rejects.toBeInstanceOf(ChunkError);
  });

  it('hands on the pushes, and ignores a malformed one', () => {
    comm.receive({ v: 1, op: 'state', ...state });
    comm.receive({ v: 1, op: 'state', generation: 'two' });
    comm.receive({ v: 1, op: 'output', msg_id: 'm1', msg_type: 'stream', content: { text: 'x' } });
    comm.receive({ v: 1, op: 'output', msg_id: 'm1' });
    comm.receive({ v: 1, op: 'ended', msg_id: 'm1', record_id: 1, status: 'ok', execution_count: 4 });
    expect(pushes.seen).toEqual(['state 2', 'output m1', 'ended m1 4']);
  });

  it('takes the new state from a restart answer and resolves the restart', async () => {
    const restart = comm.request('restart');
    comm.receive({ v: 1, id: port.lastId, op: 'restart', text: 'generation 2 ended', ...state, generation: 3 });
    await expect(restart).resolves.toMatchObject({ text: 'generation 2 ended' });
    expect(pushes.seen).toEqual(['state 3']);
  });

  it('closed from this side: what is unanswered fails, the kernel is told once, nothing more is sent or heard', async () => {
    const pending = comm.request('hello');
    port.failClose = true; // a kernel connection that is gone: the close is not sent, and that is no error
    comm.close();
    await expect(pending).rejects.toThrow(new KlbrError('NotConnected', 'the klbr comm closed'));
    expect(port.closes).toBe(1);
    expect(comm.isOpen).toBe(false);
    await expect(comm.request('hello')).rejects.toHaveProperty('name', 'NotConnected');
    expect(port.sent).toHaveLength(1);
    comm.receive({ v: 1, op: 'state', ...state });
    expect(pushes.seen).toEqual([]);
  });

  it('closed by the kernel: what is unanswered fails, and no close is sent back', async () => {
    const pending = comm.cells({ cell_ids: [] });
    comm.closedByKernel();
    await expect(pending).rejects.toThrow(new KlbrError('NotConnected', 'the kernel closed the klbr comm'));
    expect(port.closes).toBe(0);
    expect(comm.isOpen).toBe(false);
  });
});
