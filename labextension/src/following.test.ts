import type { IExecutionState } from '@jupyter/ydoc';
import type { IOutput } from '@jupyterlab/nbformat';
import type { JSONObject } from '@lumino/coreutils';
import { describe, expect, it } from 'vitest';

import { Following, IFollowedCell } from './following';

/** A code cell's model as following writes it. */
class Cell implements IFollowedCell {
  shown: IOutput[] = [];
  clears: boolean[] = [];
  executionCount: number | null = null;
  executionState: IExecutionState = 'running';
  readonly outputs = {
    add: (output: IOutput): number => this.shown.push(output),
    clear: (wait?: boolean): void => {
      this.clears.push(wait ?? false);
      this.shown = [];
    }
  };
}

function output(msgId: string, msgType: string, content: JSONObject) {
  return { op: 'output' as const, msg_id: msgId, msg_type: msgType, content };
}

function setUp(): { following: Following; cells: Map<string, Cell> } {
  const cells = new Map([
    ['a', new Cell()],
    ['b', new Cell()]
  ]);
  return { following: new Following(id => cells.get(id) ?? null), cells };
}

describe('following cells', () => {
  it('puts a followed cell’s pushed outputs into that cell, and nothing into the others', () => {
    const { following, cells } = setUp();
    following.follow('m1', 'a');
    following.output(output('m1', 'stream', { name: 'stdout', text: 'x\n' }));
    following.output(output('m2', 'stream', { name: 'stdout', text: 'not followed\n' }));
    following.output(output('m1', 'display_data', { data: { 'text/plain': '1' }, metadata: {}, transient: { display_id: 'd' } }));
    expect(cells.get('a')!.shown).toEqual([
      { output_type: 'stream', name: 'stdout', text: 'x\n' },
      { output_type: 'display_data', data: { 'text/plain': '1' }, metadata: {} }
    ]);
    expect(cells.get('b')!.shown).toEqual([]);
  });

  it('does a clear (waiting or not), and ignores a display update', () => {
    const { following, cells } = setUp();
    following.follow('m1', 'a');
    following.output(output('m1', 'stream', { name: 'stdout', text: 'x' }));
    following.output(output('m1', 'clear_output', { wait: true }));
    following.output(output('m1', 'update_display_data', { data: {}, metadata: {}, transient: { display_id: 'd' } }));
    expect(cells.get('a')!.clears).toEqual([true]);
    expect(cells.get('a')!.shown).toEqual([]);
  });

  it('shows an ended cell’s count and idles it, then follows it no more', () => {
    const { following, cells } = setUp();
    following.follow('m1', 'a');
    following.ended({ op: 'ended', msg_id: 'm1', execution_count: 7 });
    expect(cells.get('a')).toMatchObject({ executionCount: 7, executionState: 'idle' });
    following.output(output('m1', 'stream', { name: 'stdout', text: 'late' }));
    expect(cells.get('a')!.shown).toEqual([]);
  });

  it('follows nothing once cleared, and skips a cell the notebook no longer has', () => {
    const { following, cells } = setUp();
    following.follow('m1', 'a');
    following.follow('m2', 'gone');
    following.clear();
    following.output(output('m1', 'stream', { name: 'stdout', text: 'x' }));
    following.ended({ op: 'ended', msg_id: 'm1', execution_count: 1 });
    expect(cells.get('a')).toMatchObject({ shown: [], executionCount: null, executionState: 'running' });
    following.follow('m2', 'gone');
    expect(() => following.ended({ op: 'ended', msg_id: 'm2', execution_count: 1 })).not.toThrow();
  });
});
