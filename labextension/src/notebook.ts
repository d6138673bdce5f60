/**
 * Where the notebook is and which cells it holds, told to its klbr kernel: when the comm opens and
 * whenever the notebook's path changes (a rename, a move, a save-as), so the kernel finds the
 * notebook's history by its cells' ids, not by the name the notebook had when the kernel started
 * (docs/reconnecting.md, "Renamed, moved, saved as, copied"). A kernel too old for the `notebook`
 * op answers `UnknownOp`, and keeps finding the history by the path it started with.
 */

import type { NotebookPanel } from '@jupyterlab/notebook';

import { pageCells } from './cells';
import { KlbrComm } from './comm';

/** Tell the kernel where this notebook is now and which cells it holds. */
export async function tellNotebook(comm: KlbrComm, panel: NotebookPanel): Promise<void> {
  const path = panel.context.path;
  if (!path || !comm.isOpen) {
    return;
  }
  const cellIds = pageCells(panel.content).map(c => c.id);
  try {
    await comm.request('notebook', { path, cell_ids: cellIds });
    panel.node.dataset.klbrNotebook = path;
  } catch (error) {
    console.warn('klbr: the kernel was not told where the notebook is', error);
  }
}

/** Tell the kernel that the outputs of these recorded cells are back in their cells: a notice that
 * they reached no notebook is not given, and one already shown is emptied. */
export async function tellRestored(comm: KlbrComm, recordIds: number[]): Promise<void> {
  if (recordIds.length === 0 || !comm.isOpen) {
    return;
  }
  try {
    await comm.request('restored', { record_ids: recordIds });
  } catch (error) {
    console.warn('klbr: the kernel was not told which outputs were restored', error);
  }
}

/** The notebook's name for a toast: which notebook it is about, with several open. */
export function notebookName(panel: NotebookPanel): string {
  const path = panel.context.path;
  return path.slice(path.lastIndexOf('/') + 1) || 'this notebook';
}
