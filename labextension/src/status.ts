/**
 * The status bar item of a klbr notebook: generation, placement, recording (or PAUSED) and the
 * worker's memory when the kernel samples it, kept current by the kernel's `state` pushes; a click shows
 * the status dialog: what a user asks first, in plain words (`summary.ts`), this session's
 * generations on a line, then what `%klbr status` shows in a collapsed Details; with two actions.
 */

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { KlbrConnection } from './connection';
import { generationsNode, isGenerations } from './generations';
import { memoryText } from './logic';
import { IKernelState } from './messages';
import { notebookName } from './notebook';
import { offerLabel } from './plan';
import { statusTable, userRows, withServingPeak } from './summary';

export function stateText(state: IKernelState): string {
  const recording = state.recording === 'recording' ? 'recording' : state.recording === 'paused' ? 'PAUSED' : 'not recording';
  const generation = state.generation !== null ? `generation ${state.generation}` : 'no generation';
  const memory = state.memory ? ` · ${memoryText(state.memory)}` : '';
  return `klbr: ${generation} · ${state.placement} · ${recording}${memory}`;
}

export class KlbrStatus extends Widget {
  constructor(
    private readonly _tracker: INotebookTracker,
    private readonly _connections: WeakMap<object, KlbrConnection>
  ) {
    super();
    this.addClass('klbr-StatusItem');
    this.node.title = 'klbr: click for the kernel status';
    this.node.addEventListener('click', () => void this._open());
    _tracker.currentChanged.connect(this._follow, this);
    this._follow();
  }

  /** The connection of the notebook in front, if its kernel is klbr. */
  get connection(): KlbrConnection | null {
    const panel = this._tracker.currentWidget;
    return panel !== null ? (this._connections.get(panel) ?? null) : null;
  }

  /** Called when a notebook's connection is made, or its state changes. */
  refresh(): void {
    const state = this.connection?.state ?? null;
    const offer = this.connection?.rebuild.plan ? ' · rebuild?' : '';
    this.node.textContent = state !== null ? stateText(state) + offer : '';
    this.node.dataset.klbrRecording = state?.recording ?? '';
    this.setHidden(state === null);
  }

  private _follow(): void {
    const connection = this.connection;
    if (connection !== null && connection !== this._watched) {
      this._watched?.stateChanged.disconnect(this.refresh, this);
      connection.stateChanged.connect(this.refresh, this);
      this._watched = connection;
    }
    this.refresh();
  }

  private async _open(): Promise<void> {
    const connection = this.connection;
    if (connection !== null) {
      await showStatus(connection, this._tracker);
    }
  }

  private _watched: KlbrConnection | null = null;
}

/** Text with its `%klbr` commands as code. */
function withCode(text: string): Array<string | HTMLElement> {
  return text.split(/(%klbr [a-z]+(?: LIMIT)?)/).map((part, i) => {
    if (i % 2 === 0) {
      return part;
    }
    const code = document.createElement('code');
    code.textContent = part;
    return code;
  });
}

/** The status dialog, with its two actions (the status item's click, Notebook 7's toolbar item's). */
export async function showStatus(connection: KlbrConnection, tracker: INotebookTracker): Promise<void> {
  if (connection.state === null) {
    return;
  }
  const state = await connection.hello().catch(() => connection.state);
  if (state === null) {
    return;
  }
  const body = new Widget({ node: document.createElement('div') });
  body.addClass('klbr-StatusDialog');
  // This session's generations on a line (a kernel too old for `generations` leaves it out); its
  // `now` is the kernel's clock, which "since when" is counted on (the page's may differ).
  const answer = await connection.request('generations').catch(() => null);
  const line =
    answer !== null && isGenerations(answer.generations) && typeof answer.now === 'string'
      ? { generations: answer.generations, now: answer.now }
      : null;
  const now = line !== null ? Date.parse(line.now) : NaN;
  const rows = userRows(state, Number.isNaN(now) ? Date.now() : now);
  if (rows.length > 0) {
    const summary = document.createElement('table');
    summary.className = 'klbr-StatusSummary';
    for (const [question, said] of rows) {
      const row = summary.insertRow();
      const head = document.createElement('th');
      head.textContent = question;
      row.appendChild(head);
      row.insertCell().append(...withCode(said));
    }
    body.node.appendChild(summary);
  }
  if (line !== null) {
    body.node.appendChild(generationsNode(withServingPeak(line.generations, state), line.now));
  }
  // The operator's view, as `%klbr status` prints it: collapsed after the plain words, open when a
  // kernel too old to send them sent only this.
  const details = document.createElement('details');
  details.className = 'klbr-StatusDetails';
  details.open = rows.length === 0;
  const title = document.createElement('summary');
  title.textContent = 'Details (as %klbr status shows them: pid, key, signing, encryption, worker, dropped messages)';
  const table = document.createElement('pre');
  table.textContent = statusTable(state.status);
  details.append(title, table);
  body.node.appendChild(details);
  const replay = Dialog.okButton({ label: 'Replay the selected cell', caption: 'Put its recorded outputs back into it' });
  const restart = Dialog.warnButton({ label: 'Restart the generation', caption: 'As %klbr restart: a fresh namespace' });
  const close = Dialog.cancelButton({ label: 'Close' });
  const plan = connection.rebuild.plan;
  const rebuild = plan !== null ? Dialog.okButton({ label: offerLabel(plan), caption: 'See the plan first' }) : null;
  // Close is the default (Enter): the dialog is for reading; an action is chosen on purpose.
  const buttons = [close, restart, replay, ...(rebuild !== null ? [rebuild] : [])];
  const result = await showDialog({ title: 'klbr status', body, buttons, defaultButton: buttons.indexOf(close) });
  const name = notebookName(connection.panel);
  if (rebuild !== null && result.button.label === rebuild.label) {
    await connection.rebuild.showPlan();
  } else if (result.button.label === replay.label) {
    const cell = tracker.activeCell;
    if (cell === null || cell.model.type !== 'code') {
      Notification.warning(`klbr, ${name}: select a code cell to replay`);
      return;
    }
    const found = await connection.replayCell(cell.model.id).catch(() => false);
    if (!found) {
      Notification.warning(`klbr, ${name}: no recorded run of the selected cell (never run, or run before it was saved)`);
    }
  } else if (result.button.label === restart.label) {
    try {
      const { text } = await connection.request('restart');
      Notification.info(`klbr, ${name}: ${typeof text === 'string' ? text : JSON.stringify(text)}`, { autoClose: 5000 });
    } catch (error) {
      Notification.error(`klbr, ${name}: the restart failed: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
}
