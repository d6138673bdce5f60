import { describe, expect, it } from 'vitest';

import {
  Assembler,
  ChunkError,
  IAnswer,
  ICellsChunk,
  IPageCell,
  IRecord,
  IRecordPart,
  matchByCode,
  memoryText,
  mergeStreams,
  notice,
  plan,
  pushedOutput,
  sameOutputs
} from './logic';

const stream = (text: string, name = 'stdout') => ({ output_type: 'stream', name, text });

function record(fields: Partial<IRecord> = {}): IRecord {
  return {
    cell_id: 'a',
    record_id: 1,
    msg_id: 'm1',
    session: 7,
    execution_count: 1,
    status: 'ok',
    running: false,
    code: 'print(1)',
    outputs_truncated: false,
    outputs: [stream('1\n')],
    ...fields
  };
}

function part(r: IRecord, n: number, complete: boolean, outputs = r.outputs): IRecordPart {
  return { ...r, part: n, complete, outputs };
}

function chunk(n: number, cells: IRecordPart[], last: boolean, extra: Partial<ICellsChunk> = {}): ICellsChunk {
  return { v: 1, id: 'q', op: 'cells', chunk: n, last, cells, ...extra };
}

function page(fields: Partial<IPageCell> = {}): IPageCell {
  return { id: 'a', source: 'print(1)', outputs: [], executionCount: null, liveMsgId: null, ...fields };
}

function answer(records: IRecord[], extra: Partial<IAnswer> = {}): IAnswer {
  return { records, session: 7, unmatched: [], queued: [], following: [], ...extra };
}

describe('chunk assembly', () => {
  it('joins the parts of a cell split across chunks, in order, and its cut stream back into one', () => {
    const big = record({ outputs: [] });
    const assembler = new Assembler();
    expect(assembler.feed(chunk(0, [part(big, 0, false, [stream('ab')])], false))).toBeNull();
    expect(assembler.feed(chunk(1, [part(big, 1, false, [stream('cd')])], false))).toBeNull();
    const done = assembler.feed(
      chunk(2, [part(big, 2, true, [stream('e'), { output_type: 'display_data', data: { 'text/plain': 'x' } }])], true, {
        session: 7,
        queued: [{ cell_id: 'b', msg_id: 'm2', code: 'x' }]
      })
    );
    expect(done).not.toBeNull();
    expect(done!.records).toHaveLength(1);
    expect(done!.records[0].outputs).toEqual([stream('abcde'), { output_type: 'display_data', data: { 'text/plain': 'x' } }]);
    expect(done!.queued[0].msg_id).toBe('m2');
  });

  it('refuses a chunk or a part out of order', () => {
    const assembler = new Assembler();
    expect(() => assembler.feed(chunk(1, [], true))).toThrow(ChunkError);
    const other = new Assembler();
    expect(() => other.feed(chunk(0, [part(record(), 1, true)], true))).toThrow(ChunkError);
  });
});

describe('what a cell already shows', () => {
  it('compares what a person sees: streams joined, multiline text as one, metadata ignored', () => {
    expect(sameOutputs([stream('a\n'), stream('b\n')], [{ output_type: 'stream', name: 'stdout', text: ['a\n', 'b\n'] }])).toBe(true);
    expect(sameOutputs([stream('a\n')], [stream('a\n', 'stderr')])).toBe(false);
    const result = { output_type: 'execute_result', data: { 'text/plain': '42' }, metadata: {}, execution_count: 1 };
    expect(sameOutputs([result], [{ ...result, metadata: { foo: 1 } }])).toBe(true);
    expect(sameOutputs([result], [{ ...result, data: { 'text/plain': '43' } }])).toBe(false);
  });

  it('merges only adjacent writes to the same stream', () => {
    expect(mergeStreams([stream('a'), stream('b', 'stderr'), stream('c', 'stderr'), stream('d')])).toEqual([
      stream('a'),
      stream('bc', 'stderr'),
      stream('d')
    ]);
  });
});

describe('matching records to cells', () => {
  it('restores a cell that shows nothing, and leaves one that shows the same outputs', () => {
    const result = plan([page()], answer([record()]));
    expect(result.restore.map(r => r.cellId)).toEqual(['a']);
    const same = plan([page({ outputs: [stream('1\n')], executionCount: 1 })], answer([record()]));
    expect(same.restore).toEqual([]);
    expect(same.unchanged).toBe(1);
  });

  it('never duplicates: a cell showing part of the outputs gets the whole record, not the record added', () => {
    const result = plan([page({ outputs: [stream('1\n')], executionCount: null })], answer([record({ outputs: [stream('1\n2\n')] })]));
    expect(result.restore).toHaveLength(1); // replaced by the record, which the kernel cut at its follow
  });

  it('does not overwrite a cell edited since it ran, but offers it', () => {
    const result = plan([page({ source: 'print(2)' })], answer([record({ running: true })], { following: ['m1'] }));
    expect(result.restore).toEqual([]);
    expect(result.edited.map(e => e.record.record_id)).toEqual([1]);
    expect(result.unfollow).toEqual(['m1']);
    expect(notice(result, 0)).toContain('1 cell changed since it ran');
  });

  it('leaves a cell this page still hears from itself (its own execute), and unfollows it', () => {
    const result = plan([page({ liveMsgId: 'm1' })], answer([record({ running: true })], { following: ['m1'] }));
    expect(result.restore).toEqual([]);
    expect(result.unfollow).toEqual(['m1']);
  });

  it('fills a cell from an earlier session only when it shows nothing', () => {
    const old = record({ session: 3 });
    expect(plan([page()], answer([old])).restore).toHaveLength(1);
    expect(plan([page({ outputs: [stream('other\n')] })], answer([old])).restore).toEqual([]);
  });

  it('marks queued cells, unless edited or its own', () => {
    const queued = [{ cell_id: 'a', msg_id: 'm9', code: 'print(1)' }];
    expect(plan([page()], answer([], { queued })).queued).toEqual([{ cellId: 'a', msgId: 'm9' }]);
    expect(plan([page({ source: 'x' })], answer([], { queued, following: ['m9'] })).unfollow).toEqual(['m9']);
  });

  it('lists recorded cells the page has no cell for, for %klbr replay N', () => {
    const unmatched = [{ record_id: 12, cell_id: 'gone', execution_count: 4, status: 'ok', first_line: 'x = 1' }];
    const result = plan([page()], answer([], { unmatched }));
    expect(result.unmatched).toHaveLength(1);
    expect(notice(result, 0)).toContain('%klbr replay 12');
  });

  it('matches by code when ids changed on load: one cell, one record, that cell showing nothing', () => {
    const cells = [page({ id: 'n1', source: 'x = 1' }), page({ id: 'n2', source: 'y' }), page({ id: 'n3', source: 'y' })];
    const records = [record({ record_id: 5, cell_id: 'old1', code: 'x = 1' }), record({ record_id: 6, cell_id: 'old2', code: 'y' })];
    const matched = matchByCode(cells, records, new Set());
    expect([...matched.keys()]).toEqual(['n1']); // 'y' is in two cells: ambiguous
    expect(matchByCode(cells, records, new Set(['n1'])).size).toBe(0);
    const shown = [page({ id: 'n1', source: 'x = 1', executionCount: 3 })];
    expect(matchByCode(shown, records, new Set()).size).toBe(0);
  });
});

describe('pushed outputs', () => {
  it('become nbformat outputs, and clears stay clears', () => {
    expect(pushedOutput('stream', { name: 'stdout', text: 'x' })).toEqual(stream('x'));
    expect(pushedOutput('display_data', { data: {}, metadata: {}, transient: { display_id: 'd' } })).toEqual({
      output_type: 'display_data',
      data: {},
      metadata: {}
    });
    expect(pushedOutput('clear_output', { wait: true })).toEqual({ clear: true });
    expect(pushedOutput('update_display_data', {})).toBeNull();
  });
});

describe('memoryText', () => {
  it('says the memory now as %klbr status does, and the limit when there is one', () => {
    expect(memoryText({ rss: 312 * 2 ** 20, peak: 400 * 2 ** 20, limit: null })).toBe('312 MiB');
    expect(memoryText({ rss: 1.5 * 2 ** 30, peak: 2 ** 31, limit: 8 * 2 ** 30 })).toBe('1.5 GiB of 8.0 GiB');
  });
});
