/**
 * Notebook 7's klbr entry: it has no status bar, so each klbr notebook's toolbar shows what the
 * status item shows in JupyterLab (`klbr: generation N · placement · recording · memory`), kept
 * current by the kernel's `state` pushes; a click shows the status dialog.
 */

import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { KlbrConnection } from './connection';
import { showStatus, stateText } from './status';

export class KlbrToolbarItem extends Widget {
  constructor(
    private readonly _connection: KlbrConnection,
    private readonly _tracker: INotebookTracker
  ) {
    super();
    this.addClass('klbr-ToolbarItem');
    this.node.title = 'klbr: click for the kernel status';
    this.node.addEventListener('click', () => void showStatus(this._connection, this._tracker));
    _connection.stateChanged.connect(this.refresh, this);
    this.refresh();
  }

  refresh(): void {
    const state = this._connection.state;
    this.node.textContent = state !== null ? stateText(state) : '';
    this.node.dataset.klbrRecording = state?.recording ?? '';
    this.setHidden(state === null);
  }
}

/** Put the klbr entry into a notebook's toolbar (before its kernel name). */
export function addToolbarItem(panel: NotebookPanel, connection: KlbrConnection, tracker: INotebookTracker): void {
  panel.toolbar.insertItem(10, 'klbr-status', new KlbrToolbarItem(connection, tracker));
}
