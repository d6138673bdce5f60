/**
 * A 4.4 notebook strips cell ids when saved, so they change on every load and no record finds its cell
 * after a reload: a notebook on a klbr kernel is upgraded to nbformat 4.5, which keeps them.
 */

import { YNotebook } from '@jupyter/ydoc';
import { Notification } from '@jupyterlab/apputils';
import type { INotebookModel } from '@jupyterlab/notebook';

/** Upgrade the notebook to 4.5 and say so; false when it needs none (or cannot be upgraded). */
export function upgradeForCellIds(model: INotebookModel): boolean {
  // The shared model's interface is read-only; its implementation, YNotebook, sets the version.
  const shared = model.sharedModel;
  if (!(shared instanceof YNotebook) || shared.nbformat !== 4 || shared.nbformat_minor >= 5) {
    return false;
  }
  shared.nbformat_minor = 5;
  Notification.info(
    'klbr upgraded this notebook to nbformat 4.5, which keeps cell ids: save it, and its outputs can be ' +
      'restored into their cells after a reload.',
    { autoClose: 8000 }
  );
  return true;
}
