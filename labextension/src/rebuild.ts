/**
 * The way back after a generation ends, in JupyterLab: every generation change announced, and, when
 * one ended without anyone asking, a notification that offers `%klbr rebuild` with its plan to look
 * at first; the status item offers it too. Cells whose results were made in a generation that no
 * longer serves are marked (their prompt, a `klbr-EarlierGeneration` class and a title saying so).
 * `plan.ts` decides; this carries it out on one notebook. Nothing runs unless the user says so.
 */

import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import type { Cell } from '@jupyterlab/cells';
import { Notebook, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import type { KernelMessage } from '@jupyterlab/services';
import type { JSONObject } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import { notebookName } from './notebook';
import { GenerationWatch, IPlanAnswer, IRebuildPlan, announcement, earlierCells, isPlanAnswer, noRebuild, offerLabel, offerOnChange, rebuildable, stopped } from './plan';

const EARLIER = 'klbr-EarlierGeneration';

export class RebuildOffer {
  constructor(
    private readonly _panel: NotebookPanel,
    private readonly _ask: (op: string) => Promise<JSONObject>,
    private readonly _planChanged: () => void
  ) {
    NotebookActions.executionScheduled.connect(this._executed, this);
  }

  /** The notebook went: nothing of it is listened to any more. */
  dispose(): void {
    NotebookActions.executionScheduled.disconnect(this._executed, this);
  }

  /** The plan a rebuild would run now, if there is one (what the status item offers). */
  get plan(): IRebuildPlan | null {
    return this._plan;
  }

  /** The notebook's kernel changed: what the last one served says nothing of the next. */
  kernelChanged(): void {
    this._watch.reset();
    this._plan = null; // the connection's state goes null next, which the status item follows
    this._mark(new Map());
  }

  /** The kernel's state says `generation` serves: on a change (or the first state of a kernel) the plan is read again;
   * once no generation serves after one did, it is read once more, to say so if klbr starts none (a crash loop). */
  generationSeen(generation: number | null): void {
    const first = generation !== null && !this._watch.watching;
    const ended = generation === null && this._watch.watching && this._endSeen !== this._watch.last;
    const change = this._watch.seen(generation);
    if (generation !== null) {
      this._endSeen = null;
    }
    if (change === null && !first && !ended) {
      return;
    }
    if (ended) {
      this._endSeen = this._watch.last;
    }
    void this.refresh().then(answer => {
      if (answer === null) {
        return;
      }
      const name = notebookName(this._panel);
      const none = ended ? stopped(answer, name) : null;
      if (none !== null) {
        this._dismissOffer(); // a rebuild would be refused now
        Notification.error(none, { autoClose: false });
        this._panel.node.dataset.klbrGenerationNotice = none;
      }
      if (change === null) {
        return;
      }
      const offer = offerOnChange(answer);
      const actions: Notification.IAction[] = [];
      if (offer !== null) {
        actions.push({ label: offerLabel(offer), caption: 'See the plan first', callback: () => void this.showPlan() });
      }
      const text = announcement(change, answer, name);
      const id = Notification.emit(text, offer !== null ? 'warning' : 'info', { autoClose: offer !== null ? false : 6000, actions });
      if (offer !== null) {
        this._dismissOffer(); // the newest end's offer is the one to take
        this._offered = id;
      }
      this._panel.node.dataset.klbrGenerationNotice = text;
    });
  }

  private _dismissOffer(): void {
    if (this._offered !== null) {
      Notification.dismiss(this._offered);
      this._offered = null;
    }
  }

  /** Ask the kernel for the plan and mark the cells; null when it cannot say (no cell log, no comm). */
  async refresh(): Promise<IPlanAnswer | null> {
    let answer: JSONObject;
    try {
      answer = await this._ask('plan');
    } catch {
      return null; // no comm yet, or a kernel without a cell log: nothing to offer or mark
    }
    if (!isPlanAnswer(answer)) {
      console.warn('klbr: the plan answer is not what the protocol says', answer);
      return null;
    }
    const plan = rebuildable(answer);
    const changed = plan?.generation !== this._plan?.generation || plan?.cells !== this._plan?.cells;
    this._plan = plan;
    this._mark(earlierCells(answer));
    if (changed) {
      this._planChanged();
    }
    return answer;
  }

  /** The plan, then, if the user says so, the rebuild. */
  async showPlan(): Promise<void> {
    const answer = await this.refresh();
    const plan = answer !== null ? rebuildable(answer) : null;
    if (plan === null) {
      Notification.info(noRebuild(answer, notebookName(this._panel)));
      return;
    }
    const body = new Widget({ node: document.createElement('pre') });
    body.addClass('klbr-PlanDialog');
    body.node.textContent = plan.text;
    const rebuild = Dialog.warnButton({ label: 'Rebuild', caption: 'Run these cells again, in this order, in the current generation' });
    const result = await showDialog({ title: 'Rebuild the namespace?', body, buttons: [Dialog.cancelButton(), rebuild] });
    if (result.button.label === rebuild.label) {
      await this.rebuild(plan);
    }
  }

  /** `%klbr rebuild` of `plan`'s generation, as a request of the page's own: its progress in a notification, not in a cell. */
  async rebuild(plan: IRebuildPlan): Promise<void> {
    const kernel = this._panel.sessionContext.session?.kernel;
    const name = notebookName(this._panel);
    if (!kernel) {
      Notification.error(`klbr, ${name}: no kernel to rebuild in`);
      return;
    }
    this._dismissOffer(); // taken up: one rebuild at a time
    const id = Notification.emit(`klbr, ${name}: rebuilding generation ${plan.generation}'s namespace (${plan.cells} cells)…`, 'in-progress', {
      autoClose: false
    });
    const future = kernel.requestExecute({
      code: `%klbr rebuild --generation ${plan.generation}`,
      silent: false,
      store_history: false,
      allow_stdin: false,
      stop_on_error: false
    });
    let printed = '';
    future.onIOPub = (msg: KernelMessage.IIOPubMessage): void => {
      if (msg.header.msg_type === 'stream') {
        printed += (msg.content as KernelMessage.IStreamMsg['content']).text;
        const last = printed.trimEnd().split('\n').pop() ?? '';
        Notification.update({ id, message: `klbr, ${name}: ${last}` });
      }
    };
    const reply = (await future.done).content;
    const lines = printed.trimEnd().split('\n');
    if (reply.status === 'ok') {
      Notification.update({ id, message: `klbr, ${name}: ${lines[lines.length - 1]}`, type: 'success', autoClose: 8000 });
    } else if (reply.status === 'error') {
      Notification.update({ id, message: `klbr, ${name}: ${reply.ename}: ${reply.evalue}`, type: 'error', autoClose: false });
    } else {
      Notification.update({ id, message: `klbr, ${name}: the rebuild did not run`, type: 'error', autoClose: false });
    }
    this._panel.node.dataset.klbrRebuilt = reply.status;
    await this.refresh();
  }

  private _mark(earlier: Map<string, number>): void {
    for (const widget of this._panel.content.widgets) {
      if (widget.model.type !== 'code') {
        continue;
      }
      const generation = earlier.get(widget.model.id);
      if (generation !== undefined) {
        this._markCell(widget.node, generation);
      } else {
        this._unmark(widget.node);
      }
    }
  }

  private _markCell(node: HTMLElement, generation: number): void {
    node.classList.add(EARLIER);
    node.dataset.klbrGeneration = String(generation);
    const prompt = node.querySelector<HTMLElement>('.jp-InputPrompt');
    if (prompt !== null) {
      prompt.dataset.klbrGeneration = String(generation);
      prompt.title = `Ran in generation ${generation}, which ended: the variables it made are gone (klbr)`;
    }
  }

  /** A cell that runs (or ran) in the serving generation: its results have their variables. */
  private _unmark(node: HTMLElement): void {
    if (node.dataset.klbrGeneration === undefined) {
      return;
    }
    node.classList.remove(EARLIER);
    delete node.dataset.klbrGeneration;
    const prompt = node.querySelector<HTMLElement>('.jp-InputPrompt');
    if (prompt !== null) {
      delete prompt.dataset.klbrGeneration;
      prompt.title = '';
    }
  }

  /** A cell of this notebook was run: it no longer shows an earlier generation's results. */
  private _executed(_: unknown, args: { notebook: Notebook; cell: Cell }): void {
    if (args.notebook === this._panel.content) {
      this._unmark(args.cell.node);
    }
  }

  private readonly _watch = new GenerationWatch();
  private _plan: IRebuildPlan | null = null;
  private _offered: string | null = null; // the notification that offers it, while it shows
  private _endSeen: number | null = null; // the generation whose end with none after it was looked at
}
