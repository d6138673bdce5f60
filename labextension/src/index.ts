/**
 * klbr for JupyterLab (and Notebook 7): outputs come back into their cells after a reload, a closed
 * tab or a network cut, and a status bar item shows what the kernel knows. Notebooks whose kernel is
 * not klbr are left alone.
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { KlbrConnection } from './connection';
import { KlbrStatus } from './status';
import { addToolbarItem } from './toolbar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'klbr-jupyterlab:plugin',
  description: 'Puts recorded outputs back into their cells; shows the klbr kernel status.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker, statusBar: IStatusBar | null) => {
    const connections = new WeakMap<object, KlbrConnection>();
    const status = statusBar !== null ? new KlbrStatus(tracker, connections) : null;
    const track = (panel: NotebookPanel): void => {
      const connection = new KlbrConnection(panel);
      connections.set(panel, connection);
      if (status === null) {
        addToolbarItem(panel, connection, tracker); // Notebook 7: no status bar
      }
      connection.stateChanged.connect(() => {
        if (tracker.currentWidget === panel) {
          status?.refresh();
        }
      });
    };
    tracker.forEach(track);
    tracker.widgetAdded.connect((_, panel) => track(panel));
    if (statusBar !== null && status !== null) {
      statusBar.registerStatusItem('klbr-jupyterlab:status', {
        item: status,
        align: 'left',
        rank: 4,
        isActive: () => status.connection?.state != null
      });
    }
    void app;
  }
};

export default plugin;
