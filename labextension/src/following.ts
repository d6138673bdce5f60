/**
 * The cells the kernel pushes for on this page's comm: which followed msg_id is which notebook cell,
 * and what a pushed output or a cell's end does to that cell. Filled by the restore, emptied when the
 * comm closes. No JupyterLab here: a cell is what this writes of an `ICodeCellModel`.
 */

import type { IExecutionState } from '@jupyter/ydoc';
import type { IOutput } from '@jupyterlab/nbformat';

import { pushedOutput } from './logic';
import { IEndedPush, IOutputPush } from './messages';

/** What following writes of a code cell's model (an `ICodeCellModel` is one). */
export interface IFollowedCell {
  readonly outputs: {
    add(output: IOutput): number;
    clear(wait?: boolean): void;
  };
  executionCount: number | null;
  executionState: IExecutionState;
}

export class Following {
  /** `find` gives the code cell of a notebook cell id, or null when the notebook has none. */
  constructor(private readonly _find: (cellId: string) => IFollowedCell | null) {}

  /** Pushes for `msgId` go into the cell `cellId` from now on. */
  follow(msgId: string, cellId: string): void {
    this._cells.set(msgId, cellId);
  }

  /** The comm closed: nothing more is pushed for what it followed. */
  clear(): void {
    this._cells.clear();
  }

  /** An output of a followed cell: added to it, or its clear done. */
  output(push: IOutputPush): void {
    const cell = this._cell(push.msg_id);
    const output = cell !== null ? pushedOutput(push.msg_type, push.content) : null;
    if (cell === null || output === null) {
      return;
    }
    if ('output_type' in output) {
      cell.outputs.add(output);
    } else {
      cell.outputs.clear(output.clear);
    }
  }

  /** A followed cell ended: its count shown, and it is followed no more. */
  ended(push: IEndedPush): void {
    const cell = this._cell(push.msg_id);
    this._cells.delete(push.msg_id);
    if (cell === null) {
      return;
    }
    cell.executionCount = push.execution_count;
    cell.executionState = 'idle';
  }

  private _cell(msgId: string): IFollowedCell | null {
    const cellId = this._cells.get(msgId);
    return cellId !== undefined ? this._find(cellId) : null;
  }

  private _cells = new Map<string, string>(); // followed msg_id -> notebook cell id
}
