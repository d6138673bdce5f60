/**
 * A notebook's code cells as the restore sees them: what each shows now and which execute of this page
 * it still hears, and a recorded cell put into one.
 */

import { CodeCell, ICodeCellModel, isCodeCellModel } from '@jupyterlab/cells';
import type { StaticNotebook } from '@jupyterlab/notebook';

import { IPageCell, IRecord } from './logic';

/** The notebook's code cells, in order, as they are now. */
export function pageCells(notebook: StaticNotebook): IPageCell[] {
  const cells: IPageCell[] = [];
  for (const widget of notebook.widgets) {
    if (!(widget instanceof CodeCell)) {
      continue;
    }
    const model = widget.model;
    // A disposed cell has no output area; an output area that never ran anything, no future.
    const future = widget.outputArea?.future;
    cells.push({
      id: model.id,
      source: model.sharedModel.getSource(),
      outputs: model.outputs.toJSON(),
      executionCount: model.executionCount,
      liveMsgId: future && !future.isDisposed ? future.msg.header.msg_id : null
    });
  }
  return cells;
}

/** The model of the code cell with this id, or null when the notebook has none. */
export function codeCell(notebook: StaticNotebook, cellId: string): ICodeCellModel | null {
  for (const widget of notebook.widgets) {
    if (widget.model.id === cellId && isCodeCellModel(widget.model)) {
      return widget.model;
    }
  }
  return null;
}

/** A recorded cell's outputs, count and state put into a cell, whatever it showed. */
export function putRecord(model: ICodeCellModel, record: IRecord): void {
  model.outputs.fromJSON(record.outputs);
  model.executionCount = record.execution_count;
  model.executionState = record.running ? 'running' : 'idle';
}
